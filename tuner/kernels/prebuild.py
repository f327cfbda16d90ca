"""Build the TVM-FFI libraries (``aot.py``) of the fused SwiGLU kernels
that a heuristics file's SwiGLU table names, without a GPU. The first compile on the GPU then
launches them with no kernel compile and no quack import, which is the warm compile time from
a cold start: for a deployment image built on a CPU, a CI job, or before a benchmark. With
``--package`` it also writes their object files as the zip that cutetune ships
(``aot.PACKAGE``), which serves every environment like the one that built it.

Unmeasured up projections fuse with configs the heuristics pick at compile time; those are
built by the compile helper when first used, not here.
"""

from __future__ import annotations

from pathlib import Path

from ...space.problem import GemmProblem

from . import aot, swiglu
from ...models.heuristics import Heuristics
from .problems import TORCH_DTYPE_OF
from .helper import KernelPrefetcher


def fused_kernels(h: Heuristics) -> dict:
    """library key -> (problem, config) for the table's fused up projections, one per
    distinct kernel."""
    out = {}
    for key, idx in sorted(h.swiglu.items()):
        if idx is not None:
            problem, config = GemmProblem.from_key(key), h.configs[idx]
            out[swiglu.library_key(config, problem.arch, TORCH_DTYPE_OF[problem.dtype],
                                   (problem.a_major, problem.b_major))] = (problem, config)
    return out


def prebuild(h: Heuristics, workers: int | None = None, timeout_s: float = 1800.0,
             package: Path | None = None) -> dict:
    """Build ``fused_kernels(h)`` in the compile helper's GPU-blind processes, and with
    ``package`` write their object files there (``aot.write_package``); a summary."""
    kernels = fused_kernels(h)
    helper = KernelPrefetcher(h.arch, workers=workers)
    try:
        for problem, config in kernels.values():
            helper.submit_swiglu(problem, config)
        stats = helper.wait(timeout=timeout_s)
    finally:
        helper.close()
    built = sum(aot.library_ready(k) for k in kernels)
    if package is not None and built == len(kernels):
        aot.write_package(package, [
            swiglu.library_spec(c, p.arch, TORCH_DTYPE_OF[p.dtype], (p.a_major, p.b_major))
            for p, c in kernels.values()])
    return {"kernels": len(kernels), "built": built, **stats, "folder": str(aot.library_dir()),
            "package": str(package) if package is not None and built == len(kernels) else None}
