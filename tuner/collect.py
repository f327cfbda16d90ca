"""`cutetune collect`: measure problems x configs on the GPU into a Parquet dataset.

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
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from cutetune import dataset
from cutetune.space.config import KernelConfig
from cutetune.space.enumerate import enumerate_configs
from cutetune.space.problem import GemmProblem
from cutetune.space.suites import suite

from .compile import compile_kernel, configure_gpu_blind, kernel_cache_dir
from .measure import MeasureTask, TimingPolicy, init_gpu_worker, measure
from .workers import IsolatedPool

CHUNK = 256           # configs per GPU task: bounds the work lost to a crash
LOAD_COMPILED_S = 0.5  # a kernel load slower than this was compiled in-process (cache miss)


def load_problems(spec: str, dtype: str, arch: str, seed: int) -> list[tuple[str, GemmProblem]]:
    """A suite name, or a JSON file: a list of {"m","n","k",...,"suite"?} objects."""
    if spec.endswith(".json"):
        try:
            items = json.loads(Path(spec).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read problems file {spec}: {e}") from e
        return [(d.pop("suite", Path(spec).stem),
                 GemmProblem(**{"dtype": dtype, "out_dtype": dtype, "arch": arch, **d}))
                for d in items]
    return suite(spec, dtype, arch, seed)


def configs_for(problem: GemmProblem, spec: str, seed: int) -> list[KernelConfig]:
    """'all', 'sample:N' (a per-problem seeded sample), or a JSON file of config objects."""
    valid = enumerate_configs(problem.arch, problem)
    if spec == "all":
        return valid
    if spec.startswith("sample:"):
        import random

        n = int(spec.split(":", 1)[1])
        h = int(hashlib.sha256(f"{seed}:{problem.key()}".encode()).hexdigest()[:8], 16)
        return valid if n >= len(valid) else random.Random(h).sample(valid, n)
    try:
        items = json.loads(Path(spec).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--configs must be 'all', 'sample:N' or a JSON file; {spec}: {e}") from e
    return [KernelConfig.from_dict(d) for d in items]


def signature_class(problem: GemmProblem, config: KernelConfig) -> tuple:
    """Everything a compiled kernel depends on: problems of one class share kernels."""
    return (problem.arch, problem.dtype, problem.out_dtype, problem.a_major, problem.b_major,
            problem.batch > 1, config.compile_key())


def _compile_task(task):
    problem, config = task
    return compile_kernel(problem, config)


@dataclass
class Progress:
    started: float = field(default_factory=time.monotonic)
    compiled: int = 0
    compile_failed: int = 0
    measured: int = 0
    by_status: dict = field(default_factory=lambda: defaultdict(int))
    cache_misses: int = 0
    compile_wall_s: float = 0.0  # when the last kernel finished compiling
    gpu_busy_s: float = 0.0
    last_print: float = 0.0

    def line(self, pending: int, kernels_left: int) -> str:
        mins = (time.monotonic() - self.started) / 60
        return (f"[{mins * 60:6.0f}s] measured {self.measured} ({self.measured / max(mins, 1e-9):.0f}/min), "
                f"pending {pending}, kernels compiled {self.compiled} "
                f"({self.compiled / max(mins, 1e-9):.0f}/min), failed {self.compile_failed}, "
                f"left {kernels_left}; status {dict(self.by_status)}")


def collect(problems, configs_spec: str, out: str, *, seed: int = 0, time_budget_s: float = 1e9,
            compile_workers: int | None = None, cache_dir: str | None = None,
            policy: TimingPolicy = TimingPolicy(), stats_path: str | None = None,
            measure_fn=measure, gpu_init=init_gpu_worker, compile_fn=None) -> dict:
    """Measure ``problems`` (list of (suite, GemmProblem)) x configs into dataset ``out``.

    ``measure_fn(MeasureTask) -> rows``, run in a worker set up by ``gpu_init(cache_dir)``, and
    ``compile_fn((problem, config)) -> seconds``, run in GPU-blind workers, are the two edges
    to the hardware; tests swap them to exercise scheduling, isolation and resume.
    """
    done = dataset.done_keys(out)
    arches = {p.arch for _, p in problems}
    if len(arches) != 1:
        raise ValueError(f"one collect run measures one arch; got {sorted(arches)}")
    arch = arches.pop()
    # Pending work as (config, kernel id) per problem; kernels are numbered in the order the
    # problems need them, so whole problems become measurable while the rest still compiles.
    kernel_ids: dict[tuple, int] = {}
    kernels: list[tuple[GemmProblem, KernelConfig]] = []
    pending: dict[GemmProblem, list[tuple[KernelConfig, int]]] = {}
    suites: dict[GemmProblem, str] = {}
    need_cublas: set[GemmProblem] = set()
    for name, p in problems:
        if p in suites:
            continue
        suites[p] = name
        for c in configs_for(p, configs_spec, seed):
            if (p.key(), "quack", c.short()) in done:
                continue
            cls = signature_class(p, c)
            if cls not in kernel_ids:
                kernel_ids[cls] = len(kernels)
                kernels.append((p, c))
            pending.setdefault(p, []).append((c, kernel_ids[cls]))
        if (p.key(), "cublas", "") not in done:
            need_cublas.add(p)
    total = sum(map(len, pending.values()))
    print(f"collect: {len(pending)} problems with {total} pending measurements, "
          f"{len(kernels)} kernels to compile or load, {len(need_cublas)} cuBLAS baselines",
          file=sys.stderr)

    cache_dir = kernel_cache_dir(cache_dir)
    n_compile = compile_workers or max(1, (os.cpu_count() or 2) - 2)
    compile_s: dict[int, float] = {}
    compile_err: dict[int, str] = {}
    prog = Progress()
    retry: list[MeasureTask] = []

    def write(problem: GemmProblem, pairs, rows):
        ids = {c.short(): kid for c, kid in pairs}
        for r in rows:
            if r["backend"] == "quack":
                load_s = r.pop("load_s", None) or 0.0
                if load_s > LOAD_COMPILED_S:
                    prog.cache_misses += 1
                r["compile_s"] = compile_s.get(ids[r["config_key"]], load_s)
            prog.by_status[r["status"]] += 1
        dataset.append(out, rows)
        prog.measured += len(rows)

    def failed_rows(p, pairs, status, error):
        return [{**p.to_dict(), **c.to_dict(), "problem_key": p.key(), "suite": suites[p],
                 "backend": "quack", "config_key": c.short(), "status": status, "error": error,
                 "timestamp": time.time(), "compile_s": compile_s.get(kid)}
                for c, kid in pairs]

    def take(problem, pairs) -> None:
        taken = {c for c, _ in pairs}
        left = [x for x in pending[problem] if x[0] not in taken]
        if left:
            pending[problem] = left
        else:
            del pending[problem]

    def next_task(current, compiling: bool) -> MeasureTask | None:
        if retry:
            return retry.pop()
        ready = {p: [x for x in xs if x[1] in compile_s] for p, xs in pending.items()}
        ready = {p: xs for p, xs in ready.items() if xs}
        # Stay on the problem whose buffers the GPU worker holds while it has ready work,
        # else the one with most ready configs; while kernels still compile, wait for a
        # problem that is complete or has a full chunk rather than switching problems often.
        full = [p for p, xs in ready.items() if len(xs) >= min(CHUNK, len(pending[p]))]
        pick = current if current in ready else max(full or (ready if not compiling else []),
                                                     key=lambda p: len(ready[p]), default=None)
        if pick is None:
            if need_cublas and not compiling:
                p = need_cublas.pop()
                return MeasureTask(p, suites[p], (), True, policy)
            return None
        chunk = ready[pick][:CHUNK]
        take(pick, chunk)
        cublas = pick in need_cublas
        need_cublas.discard(pick)
        return MeasureTask(pick, suites[pick], tuple(c for c, _ in chunk), cublas, policy)

    with IsolatedPool(compile_fn or _compile_task, n_compile, initializer=configure_gpu_blind,
                      initargs=(arch, cache_dir), timeout_s=300) as cpool, \
         IsolatedPool(measure_fn, 1, initializer=gpu_init, initargs=(cache_dir,),
                      timeout_s=600) as gpool:
        for kernel in kernels:
            cpool.submit(kernel)
        in_flight: dict[int, tuple[MeasureTask, list]] = {}
        current = None
        while pending or need_cublas or in_flight or retry:
            over_budget = time.monotonic() - prog.started > time_budget_s
            if over_budget and not in_flight:
                break
            failed_now = []
            for r in cpool.poll(timeout=0.02 if in_flight else 0.2):
                prog.compile_wall_s = time.monotonic() - prog.started
                if r.status == "ok":
                    compile_s[r.index] = r.value
                    prog.compiled += 1
                else:
                    compile_err[r.index] = f"{r.status}: {r.error}"[:1000]
                    prog.compile_failed += 1
                    failed_now.append(r.index)
            # Configs whose kernel failed to compile are recorded without touching the GPU.
            for p in list(pending) if failed_now else ():
                bad = [x for x in pending[p] if x[1] in compile_err]
                if bad:
                    take(p, bad)
                    write(p, bad, failed_rows(p, bad, "compile_error", compile_err[bad[0][1]]))
            if not in_flight and not over_budget:
                task = next_task(current, cpool.outstanding > 0)
                if task is not None:
                    current = task.problem
                    pairs = [(c, kernel_ids[signature_class(task.problem, c)]) for c in task.configs]
                    in_flight[gpool.submit(task)] = (task, pairs)
            for r in gpool.poll(timeout=0.02):
                task, pairs = in_flight.pop(r.index)
                prog.gpu_busy_s += r.seconds
                if r.status == "ok":
                    write(task.problem, pairs, r.value)
                elif len(task.configs) > 1 or (task.configs and task.cublas):
                    # Isolate the culprit: retry one config at a time.
                    retry += [MeasureTask(task.problem, task.suite, (c,), False, task.policy)
                              for c in task.configs]
                    if task.cublas:
                        retry.append(MeasureTask(task.problem, task.suite, (), True, task.policy))
                elif task.configs:
                    status = {"crash": "crash", "timeout": "timeout"}.get(r.status, "runtime_error")
                    write(task.problem, pairs, failed_rows(task.problem, pairs, status, r.error))
            if time.monotonic() - prog.last_print > 10:
                prog.last_print = time.monotonic()
                print(prog.line(sum(map(len, pending.values())), cpool.outstanding),
                      file=sys.stderr, flush=True)
    elapsed = time.monotonic() - prog.started
    stats = {
        "elapsed_s": elapsed, "measured": prog.measured, "by_status": dict(prog.by_status),
        "kernels_compiled": prog.compiled, "kernels_failed": prog.compile_failed,
        "compile_workers": n_compile, "compile_cpu_s": sum(compile_s.values()),
        "compile_wall_s": prog.compile_wall_s,
        "measurements_per_min": prog.measured / elapsed * 60,
        "kernels_compiled_per_min": prog.compiled / elapsed * 60,
        "gpu_busy_fraction": prog.gpu_busy_s / elapsed, "cache_misses": prog.cache_misses,
        "left_pending": sum(map(len, pending.values())), "time_budget_s": time_budget_s,
    }
    print(prog.line(stats["left_pending"], 0), file=sys.stderr)
    print(json.dumps(stats, indent=1), file=sys.stderr)
    if stats_path:
        Path(stats_path).parent.mkdir(parents=True, exist_ok=True)
        Path(stats_path).write_text(json.dumps(stats, indent=1))
    return stats


def register(sub) -> None:
    p = sub.add_parser("collect", help="measure problems x configs on the GPU into a dataset",
                       description=__doc__)
    p.add_argument("--problems", default="train",
                   help="suite (llm, random, train, exhaustive; 'a+b' joins) or a JSON file")
    p.add_argument("--configs", default="sample:150",
                   help="'all' valid configs, 'sample:N' per problem, or a JSON file of configs")
    p.add_argument("--out", default="data/h200_bf16", help="dataset folder (appended, resumable)")
    p.add_argument("--arch", default="sm90", choices=("sm90", "sm100"))
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit-problems", type=int, default=None, metavar="N",
                   help="only the first N problems of the suite")
    p.add_argument("--time-budget", type=float, default=1e9, metavar="S",
                   help="stop handing out new work after S seconds (resume later)")
    p.add_argument("--compile-workers", type=int, default=None)
    p.add_argument("--cache-dir", default=None, help="quack kernel cache (QUACK_CACHE_DIR)")
    p.add_argument("--target-ms", type=float, default=TimingPolicy.target_ms,
                   help="timed GPU milliseconds per measurement (sets the repeats)")
    p.add_argument("--stats", default=None, help="write throughput stats JSON here")
    from .fleet import add_arguments  # here: fleet imports this module

    add_arguments(p)
    p.set_defaults(func=_run)


def _run(args) -> int:
    from . import fleet

    if fleet.requested(args):
        return fleet.run_fleet(args)
    problems = load_problems(args.problems, args.dtype, args.arch, args.seed)[:args.limit_problems]
    collect(problems, args.configs, args.out, seed=args.seed, time_budget_s=args.time_budget,
            compile_workers=args.compile_workers, cache_dir=args.cache_dir,
            policy=TimingPolicy(target_ms=args.target_ms), stats_path=args.stats)
    return 0
