"""Measure a few configs at a time on this machine's GPU, for the tuner's GPU backend.

One GpuExecutor per process (tuner.executor: GPU-blind compile pool plus an isolated GPU worker,
crash bisection and failure rows) stays up across calls, so a tuning loop pays the worker
start-up once and each kernel's compile once.
"""

from __future__ import annotations

import atexit

from ...space.config import KernelConfig
from ...space.problem import GemmProblem

from ... import settings
from .timing import TimingPolicy

_executors: dict[str, object] = {}
# The tuning loop measures one config per trial, so one kernel compiles at a time; a second
# worker stands by while a crashed one restarts. A pool the size of the host (30 processes on
# 32 cores) only slows the start: each worker imports cutlass. The GPU runs of
# data/reports/tune_gpu_h200/ (which had that pool) spent 29-46 s per process outside
# compiles, about the same for 7 or 28 measured configs.
COMPILE_WORKERS = 2


def _executor(arch: str):
    if arch not in _executors:
        from .executor import GpuExecutor

        _executors[arch] = GpuExecutor(arch, settings.kernel_cache_dir(), COMPILE_WORKERS,
                                       TimingPolicy())
        atexit.register(_executors[arch].close)
    return _executors[arch]


def _measure(problem: GemmProblem, configs: list[KernelConfig], cublas: bool) -> list[dict]:
    from .executor import Measure

    executor = _executor(problem.arch)
    executor.submit(0, Measure(problem, "tune", cublas), list(configs))
    while True:
        for done in executor.poll(timeout=0.5):
            return done.rows


def measure_configs(problem: GemmProblem, configs: list[KernelConfig]) -> list[dict]:
    """One dataset row per config (status, time_ms, compile_s, ...), measured on the GPU."""
    return _measure(problem, configs, cublas=False)


def measure_cublas(problem: GemmProblem) -> dict:
    """The problem's cuBLAS row (torch.mm, same layouts), timed like the configs."""
    return next(r for r in _measure(problem, [], cublas=True) if r["backend"] == "cublas")
