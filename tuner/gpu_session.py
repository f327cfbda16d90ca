"""Measure a few configs at a time on this machine's GPU, for the tuner's GPU backend.

One GpuExecutor per process (tuner.executor: GPU-blind compile pool plus an isolated GPU worker,
crash bisection and failure rows) stays up across calls, so a tuning loop pays the worker
start-up once and each kernel's compile once.
"""

from __future__ import annotations

import atexit
import os

from cutetune.space.config import KernelConfig
from cutetune.space.problem import GemmProblem

from .compile import kernel_cache_dir
from .measure import TimingPolicy

_executors: dict[str, object] = {}


def _executor(arch: str):
    if arch not in _executors:
        from .executor import GpuExecutor

        workers = max(1, (os.cpu_count() or 2) - 2)
        _executors[arch] = GpuExecutor(arch, kernel_cache_dir(), workers, TimingPolicy())
        atexit.register(_executors[arch].close)
    return _executors[arch]


def measure_configs(problem: GemmProblem, configs: list[KernelConfig]) -> list[dict]:
    """One dataset row per config (status, time_ms, compile_s, ...), measured on the GPU."""
    from .executor import Measure

    executor = _executor(problem.arch)
    executor.submit(0, Measure(problem, "tune", False), list(configs))
    while True:
        for done in executor.poll(timeout=0.5):
            return done.rows
