"""The path every call of a cutetune kernel takes, shared by the plain GEMM (``launcher``) and
the fused SwiGLU GEMM (``swiglu``): a plan per call metadata, built once; ATen for whatever
the kernel cannot take; a first launch that may compile or load the kernel, retired to ATen
for that metadata if it fails; then the plan's ``run`` on every later call."""

from __future__ import annotations

import logging
import time
from typing import Protocol

from ...space.config import KernelConfig
from ...space.problem import TMA_ALIGN_BYTES

log = logging.getLogger(__name__)


class Plan:
    """What one call metadata resolved to: its config (None: ATen), the key of the kernel's
    TVM-FFI library where one can serve it and, after the first launch, ``run(*call)`` and
    what it runs through (``via``: "library" or "quack")."""

    __slots__ = ("config", "library", "run", "via", "deferred")

    def __init__(self, config: KernelConfig | None, library: str | None = None) -> None:
        self.config, self.library = config, library
        self.run = self.via = None
        self.deferred = False  # calls ran ATen while the kernel was not ready to launch


ATEN = Plan(None)


class Kernel(Protocol):
    """One kernel's part of the path: how to run a call on ATen, whether to hold its launch
    back for now (``pending``), and its first launch, which sets ``plan.run``."""

    def aten(self, *call): ...

    def pending(self, plan: Plan, call: tuple) -> bool: ...

    def first_launch(self, plan: Plan, *call) -> None: ...

    def describe(self, plan: Plan, call: tuple) -> str: ...


def capturing(plan: Plan, call: tuple) -> bool:
    """``Kernel.pending`` of a kernel whose first launch loads or compiles it, which a CUDA
    graph being captured may refuse: such a call runs ATen (and the graph keeps it), a later
    one launches."""
    import torch

    return call[0].is_cuda and torch.cuda.is_current_stream_capturing()


def defer(plan: Plan, what: str) -> bool:
    """Run this call of ``plan`` on ATen while the compile helper builds its kernel; the
    first such call says so (``what``: the kernel, for the log). True."""
    if not plan.deferred:
        plan.deferred = True
        log.info("cutetune: %s runs ATen until the compile helper has built it", what)
    return True


def aligned(*tensors) -> bool:
    """Base pointers quack's TMA can take (checked on every call: only metadata is keyed)."""
    return all(t is None or t.data_ptr() % TMA_ALIGN_BYTES == 0 for t in tensors)


def launch_first(launch, what: str) -> bool:
    """Run a kernel's first launch (it compiles or loads the kernel) and log how long it took.
    False, with a warning, when it raises: a kernel that cannot be built must not take the
    model down, so the caller retires that call's metadata to ATen."""
    t0 = time.perf_counter()
    try:
        launch()
    except Exception as e:  # noqa: BLE001
        log.warning("cutetune: %s failed (%s: %s); using ATen", what, type(e).__name__, e)
        return False
    log.info("cutetune: first launch of %s took %.3f s", what, time.perf_counter() - t0)
    return True


def call(kernel: Kernel, plans: dict, key: tuple, plan: Plan, out, operands: tuple,
         call: tuple):
    """Run ``call`` (the kernel's arguments, ``out`` among them) with ``plan``, the one in
    ``plans`` for ``key`` (ATen if its first launch fails); ``operands`` are the tensors whose
    base pointers must be aligned. Returns ``out``, computed by the kernel or by ATen."""
    if plan.config is None or out.numel() == 0 or not aligned(*operands):
        return kernel.aten(*call)
    if plan.run is not None:
        plan.run(*call)
        return out
    if kernel.pending(plan, call):
        return kernel.aten(*call)
    if not launch_first(lambda: kernel.first_launch(plan, *call), kernel.describe(plan, call)):
        plans[key] = ATEN
        return kernel.aten(*call)
    return out
