"""The compiler as judge of the validity rules: compile configs GPU-blind and report.

Every config the rules accept must compile; grid points the rules reject are compiled too, to
show per rule whether the compiler agrees (a rule that is a design choice says so in its
docstring, and the compiler is expected to accept its points). Compiles run in an
``IsolatedPool`` so an abort or hang in ``cute.compile`` fails one config, not the run, and
into a fresh quack disk cache by default so every kernel is really compiled.

A check covers the dense family, or with ``gemm`` the grouped GEMM of that name (fwd and dgrad:
varlen M, B K- or N-major; wgrad: varlen K). A grouped point quack refuses before compiling
(split-K, swap_ab on varlen M) fails with quack's own message (``compile.kernel_layout``).
"""

from __future__ import annotations

import math
import os
import platform
import random
import re
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Callable

from ...artifacts import package_versions
from ...space.config import KernelConfig
from ...space.enumerate import check_arch, compile_keys, enumerate_configs, grid
from ...space.problem import GemmProblem, GroupedProblem
from ...space.rules import family_rules, violations

from ..kernels.compile import DSL_ARCH, compile_kernel, configure_gpu_blind
from .workers import IsolatedPool

REPORT_VERSION = 1
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the DSL colors its error text


def check_problem(arch: str, gemm: str | None = None) -> GemmProblem | GroupedProblem:
    """The problem every check compiles for: bf16 in and out, both operands K-major (the
    ``nn.Linear`` layout), or with ``gemm`` that grouped GEMM of 8 experts. M, N, K and the
    experts are run-time arguments of quack's kernel, so only the dtypes, the majors, batching
    (implied by split-K) and the ragged dimension change what is compiled."""
    if gemm is None:
        return GemmProblem(4096, 4096, 4096, arch=check_arch(arch))
    return GroupedProblem(8, 4096, 4096, 4096, gemm=gemm, arch=check_arch(arch))


@dataclass(frozen=True)
class CompileResult:
    config: KernelConfig
    status: str  # "ok" | "error" | "crash" | "timeout" (tuner.workers statuses)
    seconds: float  # wall seconds of the compile (of the failed attempt when not ok)
    error: str = ""
    cpu_seconds: float | None = None  # CPU time of the compiling process, robust to contention
    broken_rules: tuple[str, ...] = ()  # the rules that reject the config; empty if valid

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict:
        d = {"config_key": self.config.short(), "config": self.config.to_dict(),
             "status": self.status, "seconds": round(self.seconds, 3)}
        if self.cpu_seconds is not None:
            d["cpu_seconds"] = round(self.cpu_seconds, 3)
        if self.error:
            d["error"] = self.error
        if self.broken_rules:
            d["broken_rules"] = list(self.broken_rules)
        return d


def pick_valid(arch: str, sample: int | None, seed: int = 0,
               gemm: str | None = None) -> list[KernelConfig]:
    """``sample`` distinct compiled kernels of ``check_problem(arch, gemm)``'s valid space (all
    of them when ``sample`` is None or at least their number), in enumeration order."""
    keys = compile_keys(enumerate_configs(arch, check_problem(arch, gemm)))
    if sample is None or sample >= len(keys):
        return keys
    chosen = set(random.Random(seed).sample(range(len(keys)), sample))
    return [k for i, k in enumerate(keys) if i in chosen]


def pick_rejected(arch: str, n: int, seed: int = 0,
                  gemm: str | None = None) -> list[tuple[KernelConfig, tuple[str, ...]]]:
    """``n`` distinct compile keys of grid points the rules reject for ``check_problem(arch,
    gemm)``, drawn round-robin: each round takes one point per rule among the points that
    break that rule alone (the compiler's verdict on those is evidence about that rule), then
    one that breaks several."""
    problem = check_problem(arch, gemm)
    alone: dict[str, list[tuple[KernelConfig, tuple[str, ...]]]] = {}
    multi: list[tuple[KernelConfig, tuple[str, ...]]] = []
    seen: set[KernelConfig] = set()
    for c in grid(arch, problem.family):
        key = c.compile_key()
        if key in seen:
            continue
        seen.add(key)
        broken = tuple(r.name for r in violations(key, arch, problem))
        if len(broken) == 1:
            alone.setdefault(broken[0], []).append((key, broken))
        elif broken:
            multi.append((key, broken))
    rng = random.Random(seed)
    queues = [rng.sample(v, len(v)) for _, v in sorted(alone.items())]
    queues.append(rng.sample(multi, len(multi)))
    picked: list[tuple[KernelConfig, tuple[str, ...]]] = []
    while len(picked) < n and any(queues):
        for q in queues:
            if q and len(picked) < n:
                picked.append(q.pop())
    return picked


def _compile_task(task: tuple[GemmProblem | GroupedProblem, KernelConfig]) -> tuple[float, float]:
    """(wall, CPU) seconds of one compile in a worker."""
    cpu0 = time.process_time()
    wall = compile_kernel(*task)
    return wall, time.process_time() - cpu0


def compile_pool(arch: str, cache_dir: str, workers: int = 2,
                 timeout_s: float = 300.0) -> IsolatedPool:
    """Worker processes that compile for ``arch`` GPU-blind into ``cache_dir`` (a context
    manager); a compile that crashes or outlives ``timeout_s`` costs its worker, not the run."""
    return IsolatedPool(_compile_task, workers, initializer=configure_gpu_blind,
                        initargs=(arch, cache_dir), timeout_s=timeout_s)


def compile_configs(pool: IsolatedPool, arch: str, configs: list[KernelConfig],
                    on_result: Callable[[int, int, CompileResult], None] | None = None,
                    gemm: str | None = None) -> list[CompileResult]:
    """Compile each config for ``check_problem(arch, gemm)`` in ``pool``; return one result
    per config, in input order. ``on_result(done_count, total, result)`` sees progress."""
    problem = check_problem(arch, gemm)
    position = {pool.submit((problem, c)): i for i, c in enumerate(configs)}
    results: list[CompileResult | None] = [None] * len(configs)
    done = 0
    while pool.outstanding:
        for r in pool.poll():
            wall, cpu = r.value if r.status == "ok" else (r.seconds, None)
            i = position[r.index]
            results[i] = CompileResult(configs[i], r.status, wall, _ANSI.sub("", r.error), cpu)
            done += 1
            if on_result:
                on_result(done, len(configs), results[i])
    return results  # type: ignore[return-value]


def _quantile(sorted_xs: list[float], q: float) -> float:
    """Nearest-rank quantile of an ascending list."""
    return sorted_xs[max(0, math.ceil(q * len(sorted_xs)) - 1)]


def summarize(results: list[CompileResult], wall_s: float) -> dict:
    """Counts and the compile-time distribution (wall and CPU seconds) of the successful
    compiles."""
    times = sorted(r.seconds for r in results if r.ok)
    cpu = sorted(r.cpu_seconds for r in results if r.ok and r.cpu_seconds is not None)
    s = {"count": len(results), "ok": len(times), "failed": len(results) - len(times),
         "wall_s": round(wall_s, 1),
         "configs_per_minute": round(60 * len(results) / wall_s, 1) if wall_s > 0 else None}
    if times:
        s.update({"compile_s_p50": round(_quantile(times, 0.5), 3),
                  "compile_s_p90": round(_quantile(times, 0.9), 3),
                  "compile_s_max": round(times[-1], 3),
                  "compile_s_mean": round(sum(times) / len(times), 3),
                  "compile_s_total": round(sum(times), 1)})
    if cpu:
        s.update({"cpu_s_p50": round(_quantile(cpu, 0.5), 3),
                  "cpu_s_p90": round(_quantile(cpu, 0.9), 3),
                  "cpu_s_max": round(cpu[-1], 3),
                  "cpu_s_mean": round(sum(cpu) / len(cpu), 3)})
    return s


def rule_verdicts(arch: str, results: list[CompileResult],
                  family: str = "dense") -> dict[str, dict]:
    """Per rule of the family: how many of its rejected points (broken alone, or together
    with other rules) the compiler also rejects. Only points a rule breaks alone speak about
    that rule."""
    out: dict[str, dict] = {}
    for rule in family_rules(family, arch):
        alone = [r for r in results if r.broken_rules == (rule.name,)]
        shared = [r for r in results if rule.name in r.broken_rules and len(r.broken_rules) > 1]
        failed = sum(not r.ok for r in alone)
        if not alone:
            verdict = "untested (no point broken by this rule alone)"
        elif failed == len(alone):
            verdict = "compiler agrees"
        elif failed == 0:
            verdict = "compiler accepts (a design choice or a run-time limit, see why)"
        else:
            verdict = "mixed"
        out[rule.name] = {"tried_alone": len(alone), "compiler_rejects_alone": failed,
                          "tried_with_other_rules": len(shared),
                          "compiler_rejects_with_other_rules": sum(not r.ok for r in shared),
                          "verdict": verdict, "why": rule.why}
    return out


def _versions() -> dict:
    return {"python": platform.python_version(),
            **package_versions(("nvidia-cutlass-dsl", "quack-kernels", "torch"))}


def run_check(arch: str, *, sample: int | None, seed: int = 0, workers: int = 2,
              rejected: int = 0, cache_dir: str | None = None, timeout_s: float = 300.0,
              on_result: Callable[[int, int, CompileResult], None] | None = None,
              gemm: str | None = None) -> dict:
    """Compile ``sample`` valid kernels (all when None) and ``rejected`` rule-rejected grid
    points of ``arch``, dense or of the grouped ``gemm``; return the JSON-ready report.
    Without ``cache_dir`` a temporary quack cache is used and deleted, so every kernel is
    compiled from scratch."""
    problem = check_problem(arch, gemm)
    if cache_dir is None:
        with tempfile.TemporaryDirectory(prefix="cutetune-space-check-") as tmp:
            return run_check(arch, sample=sample, seed=seed, workers=workers, rejected=rejected,
                             cache_dir=tmp, timeout_s=timeout_s, on_result=on_result, gemm=gemm)
    family = problem.family
    valid = pick_valid(arch, sample, seed, gemm)
    picks = pick_rejected(arch, rejected, seed, gemm) if rejected else []
    with compile_pool(arch, cache_dir, workers, timeout_s) as pool:
        t0 = time.perf_counter()
        results = compile_configs(pool, arch, valid, on_result, gemm)
        wall = time.perf_counter() - t0
        t0 = time.perf_counter()
        rej = compile_configs(pool, arch, [c for c, _ in picks], gemm=gemm)
        rej_wall = time.perf_counter() - t0
    summary = summarize(results, wall)
    configs = enumerate_configs(arch, problem)
    all_keys = len(compile_keys(configs))
    if "cpu_s_mean" in summary:
        # All kernels over 16 one-core workers: mean CPU seconds per compile (the wall seconds
        # of a shared or oversubscribed host would overstate it), assuming linear scaling.
        summary["projected_minutes_all_kernels_16_cores"] = round(
            all_keys * summary["cpu_s_mean"] / 16 / 60, 1)
    report = {
        "report_version": REPORT_VERSION, "arch": arch, "dsl_arch": DSL_ARCH[arch],
        "family": family, "problem": problem.to_dict(), "versions": _versions(),
        "host": {"cpu_count": os.cpu_count(), "machine": platform.machine()},
        "valid_configs": len(configs), "valid_kernels": all_keys,
        "sample": len(valid), "seed": seed, "workers": workers, "timeout_s": timeout_s,
        "summary": summary,
        "failures": [r.to_dict() for r in results if not r.ok],
        "results": [r.to_dict() for r in results],
    }
    if rejected:
        rej = [replace(r, broken_rules=broken) for r, (_, broken) in zip(rej, picks)]
        report["rejected"] = {"tried": len(rej), "compiler_rejects": sum(not r.ok for r in rej),
                              "wall_s": round(rej_wall, 1),
                              "rules": rule_verdicts(arch, rej, family),
                              "results": [r.to_dict() for r in rej]}
    return report
