"""Measure problems x configs on the GPU into a Parquet dataset.

Kernels compile GPU-blind in a pool of CPU workers (into quack's disk cache) while one GPU
worker measures every (problem, config) whose kernel is ready, so collection is bound by the
GPU, not by compilation. Each finished batch is appended atomically; re-running the same
command skips what the dataset already holds. A config that fails to compile, raises,
computes wrong results, hangs or kills its process is recorded with that status.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from ... import progress
from ... import settings
from ...artifacts import write_atomic
from ...models import dataset
from ...models.kinds import kind_of
from ...space.config import KernelConfig
from ...space.enumerate import compile_keys, enumerate_configs
from ...space.problem import GemmProblem, GroupedProblem
from ...space.rules import family_of
from ...space.suites import (GROUPED_SUITES, ROUTINGS, check_routings, grouped_suite,
                             routing_counts, suite)

from ..kernels.compile import kernel_class
from .executor import GpuExecutor, Measure, compile_task, measure_task
from .timing import TimingPolicy, init_gpu_worker

CHUNK = 256  # configs per request: bounds the work a crash sends back to one-at-a-time
LOG_EVERY_S = 10.0  # the status line's period where stderr is not a terminal


def load_problems(spec: str, dtype: str, arch: str, seed: int
                  ) -> list[tuple[str, GemmProblem | GroupedProblem]]:
    """A suite name (dense or grouped: ``suites.SUITES``, ``suites.GROUPED_SUITES``), or a JSON
    file: a list of {"m","n","k",...,"suite"?} objects, grouped ones with "experts"."""
    if spec.endswith(".json"):
        try:
            items = json.loads(Path(spec).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read problems file {spec}: {e}") from e
        if not isinstance(items, list) or not items:
            raise ValueError(f"problems file {spec} must hold a non-empty list of problem "
                             f"objects ({{\"m\": ..., \"n\": ..., \"k\": ...}}), got "
                             f"{type(items).__name__}{' (empty)' if items == [] else ''}")
        out = []
        for i, d in enumerate(items):
            try:
                if not isinstance(d, dict):
                    raise TypeError(f"an object of sizes, not a {type(d).__name__}")
                d = dict(d)
                name = d.pop("suite", Path(spec).stem)
                if not isinstance(name, str):
                    raise TypeError(f"its suite must be a name, got {name!r}")
                out.append((name, (GroupedProblem if "experts" in d else GemmProblem)(
                    **{"dtype": dtype, "out_dtype": dtype, "arch": arch, **d})))
            except (TypeError, ValueError) as e:  # ProblemError is a ValueError
                raise ValueError(f"problems file {spec}, item {i} ({items[i]!r:.80}): {e}"
                                 ) from e
        return out
    if spec.split("+")[0] in GROUPED_SUITES:
        return grouped_suite(spec, dtype, arch, seed)
    return suite(spec, dtype, arch, seed)


def baseline_backend(problem) -> str:
    """The backend name of a problem's ATen row (its kind's: torch.mm's "cublas",
    torch._grouped_mm's "aten")."""
    return kind_of(problem).baseline_backend


def routed_counts(problem: GroupedProblem, seed: int, routing: str | None = None
                  ) -> tuple[int, ...]:
    """How a grouped problem's ragged rows split among its experts when it is measured: the
    ``routing`` of ``ROUTINGS``, else one drawn per problem (seeded), so a suite covers each."""
    routing = routing or ROUTINGS[_problem_hash(problem, seed) % len(ROUTINGS)]
    rows = kind_of(problem).size(problem)  # the ragged total
    return tuple(int(c) for c in routing_counts(problem.experts, rows, routing, seed))


def _problem_hash(problem, seed: int) -> int:
    """A seeded number of the problem's own, for the draws made per problem."""
    return int(hashlib.sha256(f"{seed}:{problem.key()}".encode()).hexdigest()[:8], 16)


def _sample_spec(spec: str) -> tuple[int, int | None] | None:
    """(N, K or None) of a 'sample:N' or 'sample:N@K' spec, None for another spec; ValueError
    naming --configs where N or K is not a count."""
    if not spec.startswith("sample:"):
        return None
    n, at, pool = spec.split(":", 1)[1].partition("@")
    for text, what in ((n, "a count N"), *(((pool, "a pool size K"),) if at else ())):
        try:
            ok = int(text) >= 1
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"--configs sample:N[@K] needs {what} >= 1, got {spec!r}")
    return int(n), int(pool) if at else None


def check_configs_spec(spec: str) -> int | None:
    """The count N of a 'sample:N' or 'sample:N@K' spec (None for another spec); ValueError
    naming --configs where N or K is not a count."""
    sample = _sample_spec(spec)
    return sample[0] if sample else None


def sample_quota(spec, done: set[tuple]):
    """``(problem_key, routing, todo) -> todo`` cut to what the problem lacks of the N quack
    measurements of a 'sample:N' ``spec``, whichever configs it holds (another spec's sample,
    a pool's, failed ones): such a problem is done at N. Other specs: ``todo`` as it is."""
    n = check_configs_spec(spec) if isinstance(spec, str) else None
    if not n:
        return lambda key, routing, todo: todo
    have = Counter((key, routing) for key, backend, _, routing in done if backend == "quack")
    return lambda key, routing, todo: todo[:max(0, n - have[(key, routing)])]


@lru_cache(maxsize=None)
def config_pool(cls: tuple, family: str, size: int, seed: int) -> frozenset:
    """``size`` compile keys drawn once for the problems of kernel class ``cls``
    (``kernel_class``): 'sample:N@K' draws each problem's N configs from these, so that a
    fresh machine compiles K kernels per class before problems measure at GPU speed, not
    most of the class's ~1200 as each new problem's own sample asks for more."""
    import random

    keys = compile_keys(enumerate_configs(cls[0], family=family))
    return frozenset(keys if size >= len(keys)
                     else random.Random(f"{seed}:{cls}").sample(keys, size))


def configs_for(problem: GemmProblem, spec: str, seed: int) -> list[KernelConfig]:
    """'all', 'sample:N' (a per-problem seeded sample), 'sample:N@K' (the same, drawn from
    ``config_pool``'s K compile keys, topped up from the rest where the pool holds fewer than
    N valid configs), or a JSON file of config objects."""
    valid = enumerate_configs(problem.arch, problem)
    if spec == "all":
        return valid
    if spec.startswith("sample:"):
        import random

        n, pool = _sample_spec(spec)
        rng = random.Random(_problem_hash(problem, seed))
        if pool is None:
            return valid if n >= len(valid) else rng.sample(valid, n)
        keys = config_pool(kernel_class(problem), family_of(problem), pool, seed)
        inside = [c for c in valid if c.compile_key() in keys]
        if len(inside) >= n:
            return rng.sample(inside, n)
        rest = [c for c in valid if c.compile_key() not in keys]
        return inside + rng.sample(rest, min(n - len(inside), len(rest)))
    try:
        items = json.loads(Path(spec).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--configs must be 'all', 'sample:N[@K]' or a JSON file; {spec}: {e}") from e
    return [KernelConfig.from_dict(d) for d in items]


@dataclass
class Progress:
    """Collect's counts, shown as it runs. On a terminal a bar over the pending measurements
    whose postfix says how compilation keeps up; elsewhere the full status line every
    ``LOG_EVERY_S`` (not tqdm in a log: the GPU host's logs are read with ``| tail``, which
    needs whole lines, and a bar there is one line of carriage returns)."""

    started: float = field(default_factory=time.monotonic)
    measured: int = 0
    by_status: dict = field(default_factory=lambda: defaultdict(int))
    last_print: float = 0.0

    def compiles(self, ex: GpuExecutor) -> str:
        mins = (time.monotonic() - self.started) / 60
        c = ex.counters
        return (f"kernels compiled {c.compiled} ({c.compiled / max(mins, 1e-9):.0f}/min), "
                f"failed {c.compile_failed}, left {ex.kernels_left}; "
                f"status {dict(self.by_status)}")

    def line(self, pending: int, ex: GpuExecutor) -> str:
        mins = (time.monotonic() - self.started) / 60
        return (f"[{mins * 60:6.0f}s] measured {self.measured} "
                f"({self.measured / max(mins, 1e-9):.0f}/min), pending {pending}, "
                + self.compiles(ex))

    def show(self, bar, finished: int, pending: int, ex: GpuExecutor) -> None:
        """Advance ``bar`` by the ``finished`` measurements, or without a bar log the line."""
        if not bar.disable:
            bar.set_postfix_str(self.compiles(ex), refresh=False)
            bar.update(finished)  # miniters=0: redrawn each mininterval, finished or not
        elif time.monotonic() - self.last_print > LOG_EVERY_S:
            self.last_print = time.monotonic()
            print(self.line(pending, ex), file=sys.stderr, flush=True)


def collect(problems, configs_spec: str, out: str, *, seed: int = 0, time_budget_s: float = 1e9,
            compile_workers: int | None = None, cache_dir: str | None = None,
            policy: TimingPolicy = TimingPolicy(), stats_path: str | None = None,
            routings=None, measure_fn=measure_task, gpu_init=init_gpu_worker,
            compile_fn=None) -> dict:
    """Measure ``problems`` (list of (suite, GemmProblem)) x configs into dataset ``out``; a
    grouped problem under each of ``routings`` (``check_routings``; None: one drawn for it).

    ``measure_fn(MeasureTask) -> rows``, run in a worker set up by ``gpu_init(cache_dir)``, and
    ``compile_fn((problem, config)) -> seconds``, run in GPU-blind workers, are the two edges
    to the hardware (see tuner.executor); tests swap them to exercise scheduling, isolation
    and resume. Past ``time_budget_s`` no new GPU task starts; the one running finishes.
    """
    routings = check_routings(routings)
    done = dataset.done_keys(out)
    held = dataset.device_names(out)
    arches = {p.arch for _, p in problems}
    if len(arches) != 1:
        raise ValueError(f"one collect run measures one arch; got {sorted(arches)}")
    arch = arches.pop()
    # Requests of at most CHUNK configs, problem after problem: kernels compile in that order,
    # so whole problems become measurable while the rest still compile, and consecutive GPU
    # tasks reuse the problem's operand buffers.
    requests: list[tuple[Measure, list[KernelConfig]]] = []
    seen: set = set()
    lacking = sample_quota(configs_spec, done)
    for name, p in problems:
        if p in seen:
            continue
        seen.add(p)
        configs = configs_for(p, configs_spec, seed)
        splits = ([routed_counts(p, seed, r) for r in routings or (None,)]
                  if isinstance(p, GroupedProblem) else [None])
        for counts in dict.fromkeys(splits):  # two routings may split the rows alike
            routing = dataset.routing_text(counts)
            todo = [c for c in configs
                    if dataset.measurement_key(p.key(), "quack", c.short(), routing) not in done]
            todo = lacking(p.key(), routing, todo)
            cublas = dataset.measurement_key(p.key(), baseline_backend(p), "", routing) not in done
            for i in range(0, max(len(todo), 1), CHUNK):
                if todo[i:i + CHUNK] or cublas:
                    requests.append((Measure(p, name, cublas and i == 0, counts),
                                     todo[i:i + CHUNK]))
    total = sum(len(cs) for _, cs in requests)
    print(f"collect: {len(seen)} problems, {total} pending measurements in {len(requests)} "
          f"requests", file=sys.stderr)

    n_compile = compile_workers or max(1, (os.cpu_count() or 2) - 2)
    run_id = uuid.uuid4().hex[:12]
    prog = Progress()
    pending = total
    ex = GpuExecutor(arch, settings.kernel_cache_dir(cache_dir), n_compile, policy,
                     depth=max(1, len(requests)), measure_fn=measure_fn, gpu_init=gpu_init,
                     compile_fn=compile_fn or compile_task)
    bar = progress.bar(total, "measure", unit="config", miniters=0)
    try:
        for i, (request, configs) in enumerate(requests):
            ex.submit(i, request, configs)
        left = len(requests)
        while left:
            within_budget = time.monotonic() - prog.started <= time_budget_s
            if not within_budget and not ex.measuring:
                break
            finished = 0
            for d in ex.poll(timeout=0.2, start=within_budget):
                dataset.check_device(d.rows, held, out)
                left -= 1
                finished += len(requests[d.job_id][1])
                for r in d.rows:
                    r["run_id"] = run_id
                    prog.by_status[r["status"]] += 1
                dataset.append(out, d.rows)
                prog.measured += len(d.rows)
            pending -= finished
            prog.show(bar, finished, pending, ex)
    finally:
        bar.close()
        ex.close()
    elapsed = time.monotonic() - prog.started
    c = ex.counters
    stats = {
        "elapsed_s": elapsed, "measured": prog.measured, "by_status": dict(prog.by_status),
        "kernels_compiled": c.compiled, "kernels_failed": c.compile_failed,
        "compile_workers": n_compile, "compile_cpu_s": sum(ex.compile_s.values()),
        "compile_wall_s": c.compile_wall_s,
        "measurements_per_min": prog.measured / elapsed * 60,
        "kernels_compiled_per_min": c.compiled / elapsed * 60,
        "gpu_busy_fraction": c.gpu_busy_s / elapsed, "cache_misses": c.cache_misses,
        "retimed": c.retimed, "unstable_after_retimes": c.unstable,
        "left_pending": pending, "time_budget_s": time_budget_s,
    }
    print(prog.line(pending, ex), file=sys.stderr)
    print(json.dumps(stats, indent=1), file=sys.stderr)
    if stats_path:
        write_atomic(stats_path, json.dumps(stats, indent=1), "stats file")
    return stats
