"""The measurement engine behind `collect`, the fleet's GPU workers and the tuner's GPU backend.

Kernels compile GPU-blind in a pool of CPU workers (into quack's disk cache) while one GPU
worker process measures the requests whose kernels are ready, in the order they were
submitted. A task that crashes or hangs the GPU worker is retried one config at a time; a
config that still fails, or whose kernel does not compile, is recorded with that status.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Protocol

from ...models import dataset
from ...space.config import KernelConfig
from ...space.problem import GemmProblem

from ..kernels.compile import compile_kernel, configure_gpu_blind, signature_class
from .grouped import measure_grouped
from .timing import MeasureTask, TimingPolicy, init_gpu_worker, measure
from .workers import IsolatedPool

LOAD_COMPILED_S = 0.5  # a kernel load slower than this was compiled in-process (cache miss)


def measure_task(task: MeasureTask) -> list[dict]:
    """The GPU worker's entry point: a grouped problem's task (its rows' split given) by
    ``grouped``, a dense one by ``timing``."""
    return measure(task) if task.counts is None else measure_grouped(task)


def compile_task(task) -> float:
    problem, config = task
    return compile_kernel(problem, config)


class Request(Protocol):
    """What to measure: one problem's configs, and its cuBLAS row when ``cublas``."""

    problem: GemmProblem
    suite: str
    cublas: bool


@dataclass(frozen=True)
class Measure:
    problem: GemmProblem
    suite: str
    cublas: bool
    counts: tuple[int, ...] | None = None  # a grouped problem's split among its experts


@dataclass(frozen=True)
class Done:
    job_id: int
    rows: list[dict]
    error: str = ""  # set: the request could not be measured here


@dataclass
class _Job:
    job_id: int
    request: Request
    kernels: dict[KernelConfig, int]  # config -> compile task of its kernel
    todo: list[MeasureTask] | None = None  # None until every kernel compiled or failed
    running: int = 0
    rows: list[dict] = field(default_factory=list)


@dataclass
class Counters:
    compiled: int = 0
    compile_failed: int = 0
    compile_wall_s: float = 0.0  # when the last kernel finished compiling
    gpu_busy_s: float = 0.0
    cache_misses: int = 0
    retimed: int = 0  # measurements timed again for their spread (timing.UNSTABLE_SPREAD)
    unstable: int = 0  # of those, still above it after the last try


class GpuExecutor:
    """Submit requests, poll for finished ones. Holds up to ``depth`` requests, so the next
    ones compile while one is measured; kernels compile in submission order."""

    def __init__(self, arch: str, cache_dir: str, compile_workers: int, policy: TimingPolicy,
                 *, depth: int = 3, measure_fn=measure_task, gpu_init=init_gpu_worker,
                 compile_fn=compile_task):
        self.policy, self.depth = policy, depth
        self.started = time.monotonic()
        self.cpool = IsolatedPool(compile_fn, compile_workers, initializer=configure_gpu_blind,
                                  initargs=(arch, cache_dir), timeout_s=300).__enter__()
        self.gpool = IsolatedPool(measure_fn, 1, initializer=gpu_init, initargs=(cache_dir,),
                                  timeout_s=600).__enter__()
        self.kernel_ids: dict[tuple, int] = {}
        self.compile_s: dict[int, float] = {}
        self.compile_err: dict[int, str] = {}
        self.jobs: list[_Job] = []
        self.in_flight: dict[int, tuple[_Job, MeasureTask]] = {}
        self.counters = Counters()

    def room(self) -> bool:
        return len(self.jobs) < self.depth

    @property
    def measuring(self) -> bool:
        return bool(self.in_flight)

    @property
    def kernels_left(self) -> int:
        return self.cpool.outstanding

    def submit(self, job_id: int, request: Request, configs: list[KernelConfig]) -> None:
        kernels = {}
        for c in configs:
            cls = signature_class(request.problem, c)
            if cls not in self.kernel_ids:
                self.kernel_ids[cls] = self.cpool.submit((request.problem, c))
            kernels[c] = self.kernel_ids[cls]
        self.jobs.append(_Job(job_id, request, kernels))

    def _failed(self, job: _Job, configs, status: str, error: str) -> list[dict]:
        p, counts = job.request.problem, getattr(job.request, "counts", None)
        extra = {} if counts is None else {"expert_counts": dataset.routing_text(counts)}
        return [{**p.to_dict(), **c.to_dict(), **extra, "problem_key": p.key(),
                 "suite": job.request.suite,
                 "backend": "quack", "config_key": c.short(), "status": status,
                 "error": error[:1000], "timestamp": time.time(),
                 "compile_s": self.compile_s.get(job.kernels[c])} for c in configs]

    def _measured(self, job: _Job, rows: list[dict]) -> None:
        by_key = {c.short(): k for c, k in job.kernels.items()}
        for r in rows:
            unstable = r.pop("unstable", False)
            if r.pop("retimes", 0):
                self.counters.retimed += 1
                self.counters.unstable += unstable
            if r["backend"] == "quack":
                load_s = r.pop("load_s", None) or 0.0
                self.counters.cache_misses += load_s > LOAD_COMPILED_S
                r["compile_s"] = self.compile_s.get(by_key[r["config_key"]], load_s)
        job.rows += rows

    def poll(self, timeout: float, start: bool = True) -> list[Done]:
        """Collect compile and GPU results; with ``start``, hand the GPU its next task."""
        for r in self.cpool.poll(timeout=0.02 if self.in_flight else min(timeout, 0.2)):
            self.counters.compile_wall_s = time.monotonic() - self.started
            if r.status == "ok":
                self.compile_s[r.index] = r.value
                self.counters.compiled += 1
            else:
                self.compile_err[r.index] = f"{r.status}: {r.error}"[:1000]
                self.counters.compile_failed += 1
        for job in self.jobs:
            if job.todo is None and all(k in self.compile_s or k in self.compile_err
                                        for k in job.kernels.values()):
                bad = [c for c, k in job.kernels.items() if k in self.compile_err]
                for c in bad:
                    job.rows += self._failed(job, [c], "compile_error",
                                             self.compile_err[job.kernels[c]])
                good = tuple(c for c in job.kernels if c not in bad)
                rq = job.request
                counts = getattr(rq, "counts", None)
                job.todo = ([MeasureTask(rq.problem, rq.suite, good, rq.cublas, self.policy,
                                         counts)] if good or rq.cublas else [])
        if start and not self.in_flight:
            job = next((j for j in self.jobs if j.todo), None)
            if job is not None:
                task = job.todo.pop(0)
                job.running += 1
                self.in_flight[self.gpool.submit(task)] = (job, task)
        for r in self.gpool.poll(timeout=0.02):
            job, task = self.in_flight.pop(r.index)
            job.running -= 1
            self.counters.gpu_busy_s += r.seconds
            if r.status == "ok":
                self._measured(job, r.value)
            elif len(task.configs) > 1 or (task.configs and task.cublas):
                # isolate the culprit: one config at a time
                job.todo += [replace(task, configs=(c,), cublas=False) for c in task.configs]
                if task.cublas:
                    job.todo.append(replace(task, configs=()))
            elif task.configs:
                status = {"crash": "crash", "timeout": "timeout"}.get(r.status, "runtime_error")
                job.rows += self._failed(job, task.configs, status, r.error)
        finished = [j for j in self.jobs if j.todo == [] and j.running == 0]
        self.jobs = [j for j in self.jobs if j not in finished]
        return [Done(j.job_id, j.rows) for j in finished]

    def close(self) -> None:
        self.cpool.__exit__(None, None, None)
        self.gpool.__exit__(None, None, None)
