"""Reduced mode's feedback: Inductor's benchmark timings of the nodes cutetune served,
appended to a cutetune dataset (and a Triton sweep file) for retraining."""

from __future__ import annotations

import json
import logging
import math
import os
import time
import uuid as uuidlib

from torch._inductor.select_algorithm import (
    ExternKernelCaller,
)

from ...space.problem import GemmProblem, ProblemError

from ...artifacts import check_writable_dir, environment
from ...models.triton_sweep import append_row, sweep_row
from ..kernels import launcher, problems
from ..kernels.problems import as_config
from .choices import PRIMARY_ATEN, LastResortCaller

log = logging.getLogger(__name__)


ATEN_KERNELS = ("mm", "addmm", "bmm", "bias_addmm")  # extern names whose timings are cuBLAS
FEEDBACK_SUITE = "inductor_feedback"
TRITON_FEEDBACK = "triton_mm.jsonl"  # in the feedback dataset folder: Triton sweep rows


class FeedbackRecorder:
    """An Inductor feedback saver appending the timings of the nodes cutetune served to a
    dataset: quack rows with their config, ATen rows as backend "cublas"; and of the
    host-bound mm it had Inductor benchmark Triton templates for, a Triton sweep row in the
    dataset folder's TRITON_FEEDBACK file (``triton_timings``), for ``cutetune emit
    --triton-sweep``. Timings the autotune cache replays unchanged are not appended twice."""

    def __init__(self, path: str | os.PathLike) -> None:
        # a folder it can write, checked at ``enable``: not at Inductor's first benchmark
        self.path = check_writable_dir(path, "feedback dataset folder")
        self.run_id = uuidlib.uuid4().hex[:12]
        self._seen: set[tuple] | None = None
        self._triton_seen: set[tuple] | None = None
        self._env: dict | None = None

    def _load_seen(self) -> set[tuple]:
        from ...models.dataset import load, parts

        if not parts(self.path):
            return set()
        t = load(self.path, columns=["suite", "problem_key", "backend", "config_key", "time_ms"])
        return {(pk, b, ck, tm) for s, pk, b, ck, tm in zip(*(t.column(c).to_pylist() for c in (
            "suite", "problem_key", "backend", "config_key", "time_ms"))) if s == FEEDBACK_SUITE}

    @staticmethod
    def _triton_key(row: dict) -> tuple:
        return (row["m"], row["n"], row["k"], row["majors"],
                tuple((c["name"], c["ms"]) for c in row["choices"]))

    def _load_triton_seen(self) -> set[tuple]:
        """The keys of the Triton rows already in the file (earlier processes' replays too); a
        line that does not parse is left for ``load_sweep`` to name, not fed back again."""
        seen = set()
        path = self.path / TRITON_FEEDBACK
        for line in path.read_text().splitlines() if path.exists() else ():
            try:
                seen.add(self._triton_key(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
        return seen

    def _problem(self, input_nodes) -> GemmProblem | None:
        """The benchmarked node's GemmProblem (None where quack could not run it), with this
        recorder's environment read on first use."""
        mat1, mat2 = input_nodes[-2:]
        try:
            problem = problems.node_problem(mat1, mat2, mat1.get_dtype(),
                                            problems.device_arch(mat1.get_device()))
        except ProblemError:
            return None
        if self._env is None:
            self._env = environment()
        return problem

    def rows(self, timings, name, input_nodes) -> list[dict]:
        served = [c for c in timings if isinstance(c, ExternKernelCaller)
                  and c.choice.name in (launcher.MM_KERNEL, launcher.ADDMM_KERNEL)]
        if name not in PRIMARY_ATEN or not served:
            return []
        problem = self._problem(input_nodes)
        if problem is None:
            return []
        base = {**self._env, **problem.to_dict(), "run_id": self.run_id,
                "timestamp": time.time(), "problem_key": problem.key(), "suite": FEEDBACK_SUITE}
        rows = []
        for choice, ms in timings.items():
            if not isinstance(choice, ExternKernelCaller):
                continue
            if choice in served:
                cfg = as_config(choice.kwargs["config"])
                row = {**base, "backend": "quack", "config_key": cfg.short(), **cfg.to_dict()}
            elif choice.choice.name in ATEN_KERNELS:
                row = {**base, "backend": "cublas", "config_key": ""}  # as the harness
            else:
                continue
            ok = math.isfinite(ms)
            row.update(status="ok" if ok else "runtime_error", time_ms=ms if ok else None,
                       error=None if ok else "Inductor benchmark returned inf")
            rows.append(row)
        return rows

    def triton_row(self, timings, name, input_nodes) -> dict | None:
        """The Triton sweep row of a plain mm whose benchmark held Triton templates, or None."""
        from torch._inductor.select_algorithm import TritonTemplateCaller

        if name != "mm" or not any(isinstance(c, TritonTemplateCaller) for c in timings):
            return None
        problem = self._problem(input_nodes)
        if problem is None:
            return None
        return sweep_row(problem, timings, self._env["device_name"], self._env["torch_version"],
                         suite=FEEDBACK_SUITE, run_id=self.run_id, timestamp=time.time())

    def __call__(self, timings, name, input_nodes, choices, profiler_bench_function,
                 precompile_times=None) -> None:
        """Inductor's FeedbackFunction signature (the same in torch 2.11 and 2.13)."""
        from ...models.dataset import append

        timings = {c: ms for c, ms in timings.items() if not isinstance(c, LastResortCaller)}
        triton = self.triton_row(timings, name, input_nodes)
        if triton is not None:
            if self._triton_seen is None:
                self._triton_seen = self._load_triton_seen()
            key = self._triton_key(triton)
            if key not in self._triton_seen:
                self._triton_seen.add(key)
                append_row(self.path / TRITON_FEEDBACK, triton)
        rows = self.rows(timings, name, input_nodes)
        if not rows:
            return
        if self._seen is None:
            self._seen = self._load_seen()
        fresh = []
        for r in rows:
            key = (r["problem_key"], r["backend"], r["config_key"], r["time_ms"])
            if key not in self._seen:
                self._seen.add(key)
                fresh.append(r)
        append(self.path, fresh)
