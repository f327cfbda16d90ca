"""Plain GEMM kernels as TVM-FFI libraries (``aot.py``), so a process launches them without
importing quack or cutlass.

In reduced mode the compile helper builds each prefetched plain mm kernel as a library: Inductor's
benchmark and the compiled model then load it in milliseconds, where quack's path cost the
compiling process quack's import (2.5-4.2 s on the H200 host, ``launcher_log`` in
data/bench/e2e_h200_1gpu_fork*.json.gz), on the critical path of a compile whose kernels were all
built. The library holds the kernel quack's ``_gemm_execute`` would compile for the call, built
through that same entry point (``launcher``'s) on CPU tensors with the launch left out, so the
two cannot disagree on the compiled signature or the launch arguments.

Only what has nothing per call qualifies: a 2D mm without addend or alpha, no split-K, and no
sm90 dynamic scheduler (a per-call semaphore); everything else stays on quack's path.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

from ...space.config import KernelConfig
from ...space.problem import GemmProblem

from . import aot, quack_gemm
from .compile import kernel_object_path
from .problems import TORCH_DTYPE_OF
from ...artifacts import write_atomic


def unsupported_reason(problem: GemmProblem, config: KernelConfig) -> str | None:
    """Why this plain mm's kernel cannot run from a library (None: it can)."""
    if problem.batch != 1:
        return "a batched GEMM"
    if config.split_k != 1:
        return "split-K allocates buffers per call"
    if config.is_dynamic_persistent and problem.arch == "sm90":
        return "sm90's dynamic scheduler takes a semaphore per call"
    return None


def library_spec(problem: GemmProblem, config: KernelConfig) -> dict:
    """What the kernel's library is (``aot.kernel_key``'s spec): the kernel serves every M, N
    and K of these dtypes and operand majors, and every swizzle of the config (a launch
    argument: ``runner`` sets it)."""
    return {"kind": f"gemm-{problem.a_major}{problem.b_major}",
            "config": config.compile_key().to_dict(), "arch": problem.arch,
            "dtype": problem.dtype, "out_dtype": problem.out_dtype}


def library_key(problem: GemmProblem, config: KernelConfig) -> str:
    return aot.kernel_key(library_spec(problem, config))


@contextmanager
def _plan_only(clusters: int):
    """While it holds, quack's plain GEMM builds its plan (compiling the kernel) and launches
    nothing, and its query of the active clusters answers ``clusters`` (no GPU to ask)."""
    import quack.gemm as qgemm

    run, ask = qgemm.run_gemm_plan, qgemm.get_max_active_clusters
    qgemm.run_gemm_plan = lambda *args, **kwargs: None
    qgemm.get_max_active_clusters = lambda *args, **kwargs: clusters
    try:
        yield
    finally:
        qgemm.run_gemm_plan, qgemm.get_max_active_clusters = run, ask


def _cpu_plan(problem: GemmProblem, config: KernelConfig, clusters: int):
    """quack's launch plan of the kernel, through ``quack_gemm``'s call of quack (the launcher's own) on
    ``aot.cpu_operands`` of the problem's dtype and majors, in a process made GPU-blind by
    ``compile.configure_gpu_blind``."""
    a, b, out = aot.cpu_operands(TORCH_DTYPE_OF[problem.dtype],
                                 (problem.a_major, problem.b_major))
    with _plan_only(clusters):
        return quack_gemm.quack_dispatch_plan(config, problem.arch, a, b, out)


def build_library(problem: GemmProblem, config: KernelConfig) -> float:
    """Compile the kernel with quack and keep it as a TVM-FFI library (``aot.build``), in a
    GPU-blind process, its object file also in quack's disk cache (where quack's own path
    finds it, should the library not load); seconds taken."""
    import quack.cache as qcache

    t0 = time.perf_counter()
    key = library_key(problem, config)
    aot.build(key, lambda: _cpu_plan(problem, config, aot.CLUSTERS_SENTINEL),
              lambda plan: aot.gemm_plan_arguments(plan, config.swap_ab))
    if qcache.CACHE_ENABLED:
        path = kernel_object_path(problem, config)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, aot.object_path(key).read_bytes())
    return time.perf_counter() - t0


def runner(config: KernelConfig, key: str, device):
    """``run(a, b, out, *rest)`` through the library ``key`` when it is built and loads, else
    None (``rest``: the call's addend arguments, None and ones where a library serves it)."""
    lib = aot.load(key, device, config.cluster_size, "the kernel", config.max_swizzle_size)
    return None if lib is None else (lambda a, b, out, *_: lib.launch(a, b, out, None))
