"""Compile quack GEMM kernels without a GPU, into quack's on-disk kernel cache.

The GPU process later launches the same config through quack's normal entry point
(``gemm_interface._gemm_execute``), whose plan build looks the kernel up in quack's
``jit_cache`` by the exact positional arguments of ``quack.gemm._compile_gemm``. So
``kernel_signature`` mirrors that plan build for a plain GEMM (no epilogue), dense or grouped
(varlen M or varlen K, without gather): if the two drift apart the GPU process compiles
in-process, which the harness detects and reports as a cache miss.

``cute.compile`` is not thread-safe: compile in processes (see ``tuner.workers``), each
made GPU-blind by ``configure_gpu_blind`` before the first compile.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ...space.config import ARCH_CAPACITY, KernelConfig
from ...space.problem import GemmProblem, GroupedProblem, ProblemError
from ...space.rules import kernel_b_major

DSL_ARCH = {"sm90": "sm_90a", "sm100": "sm_100a"}


@dataclass(frozen=True)
class KernelLayout:
    """Operand majors and batching as the kernel sees them, after quack's host-side routing
    (swap_ab exchanges A and B and transposes D; a dense B is passed (K, N) when not swapped,
    a grouped one (N, K)), and the ragged dimension of a grouped GEMM ("m", "k"; None dense)."""

    a_major: str
    b_major: str
    d_major: str
    batched: bool
    b_kn: bool
    varlen: str | None = None


def kernel_layout(problem: GemmProblem | GroupedProblem, config: KernelConfig) -> KernelLayout:
    """Mirror of quack.gemm_interface's routing on sm90+ (gemm_tuned's checks, then
    _gemm_execute's), for a dense or a grouped GEMM; ProblemError where quack refuses the
    config before building a kernel."""
    varlen = _grouped_varlen(problem, config) if isinstance(problem, GroupedProblem) else None
    # Dense GEMMs are 2D unless batched or split; varlen ones are batched by their experts.
    batched = varlen is not None or problem.batch > 1 or config.split_k > 1
    if not config.swap_ab:
        # A dense B stays (K, N) (b_kn): "n"-major when N is contiguous. A varlen B crosses as
        # B.mT, (E, N, K) or (N, total_K), the same logical label.
        return KernelLayout(problem.a_major, problem.b_major, "n", batched, varlen is None, varlen)
    # Swapped: the kernel's A is B^T (N, K), its B is A (M, K), its D is D^T (N, M).
    a_major = "k" if problem.b_major == "k" else "m"
    return KernelLayout(a_major, kernel_b_major(config, problem), "m", batched, False, varlen)


def _grouped_varlen(problem: GroupedProblem, config: KernelConfig) -> str:
    """The grouped problem's ragged dimension, after quack's host checks of a varlen call (the
    ``grouped_no_split_k`` and ``varlen_m_no_swap_ab`` rules state them too)."""
    if config.split_k > 1:
        raise ProblemError("quack refuses split-K on a grouped GEMM (_build_gemm_plan: "
                           "'split_k requires a dense GEMM (no varlen_m/varlen_k/gather_A)')")
    if problem.ragged == "m" and config.swap_ab:
        raise ProblemError("quack refuses swap_ab on a varlen-M GEMM (gemm_tuned: "
                           "'Variable-length sequences not supported with swap_ab')")
    return problem.ragged


def kernel_signature(problem: GemmProblem | GroupedProblem, config: KernelConfig) -> tuple:
    """Positional arguments of ``quack.gemm._compile_gemm`` for this plain GEMM, exactly as
    ``quack.gemm._build_gemm_plan`` passes them (the jit cache keys on them)."""
    import cutlass
    from quack.gemm_config import SplitKMode
    from quack.rounding import RoundingMode

    dt = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}
    ab, d = dt[problem.dtype], dt[problem.out_dtype]
    lay = kernel_layout(problem, config)
    # The cache key is a hash of the arguments' pickle, which writes an object seen before as
    # a reference to it: equal strings must also be the same objects as in quack's own call
    # (its literals, interned), or a major read from JSON ("n" beside D's "n") hashes apart.
    a_major, b_major, d_major = (sys.intern(m) for m in (lay.a_major, lay.b_major, lay.d_major))
    return (
        ab, ab, d, None,                        # a, b, d, c dtypes
        a_major, b_major, d_major, None,
        (config.tile_m, config.tile_n),
        (config.cluster_m, config.cluster_n, 1),
        config.pingpong,
        True,                                   # persistent
        config.is_dynamic_persistent,
        None, None, 0,                          # rowvec, colvec dtypes, colvec ndim
        0, 0,                                   # alpha, beta modes (neutral)
        False,                                  # add_to_output
        (),                                     # concat layout
        lay.varlen == "m", lay.varlen == "k",   # varlen_m, varlen_k
        False, False, False,                    # gather_A, tma_gather, permute
        (ARCH_CAPACITY[problem.arch], 0),
        RoundingMode.RN,
        0,                                      # sr_seed mode
        None,                                   # num_warps
        None, None,                             # scale-factor dtype, vec size
        config.split_k,
        SplitKMode.SERIAL,
        lay.batched,
        lay.b_kn,
        True,                                   # sf_batched (unused without scale factors)
        None, 0, None, None, None,              # sfd, norm-const mode, sfd col, mma dtypes
        False,                                  # all-gather
    )


def kernel_object_path(problem: GemmProblem | GroupedProblem, config: KernelConfig,
                       cache_root: str | None = None):
    """Where quack's ``jit_cache`` keeps this kernel's object file: under ``cache_root`` (default:
    quack's cache root in this process), a folder per quack source fingerprint, a file per
    hash of the compile function's name and ``kernel_signature``."""
    from quack.cache.jit import _compute_source_fingerprint, _key_to_hash, get_cache_path

    sha = _key_to_hash(("_compile_gemm",) + kernel_signature(problem, config))
    root = Path(cache_root) if cache_root else get_cache_path()
    return root / _compute_source_fingerprint() / f"{sha}.o"


def configure_gpu_blind(arch: str, cache_dir: str | None = None) -> None:
    """Make this process compile for ``arch`` without touching a GPU (quack's compile-pool
    setup: hidden devices, pinned dispatch and ptxas arch, static smem table)."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["QUACK_ARCH"] = arch.replace("sm", "sm_")
    os.environ["CUTE_DSL_ARCH"] = DSL_ARCH[arch]
    if cache_dir:
        os.environ["QUACK_CACHE_DIR"] = cache_dir
    from quack.cache.async_compile import _pool_initializer

    _pool_initializer(os.environ["QUACK_ARCH"], os.environ["CUTE_DSL_ARCH"])
    if cache_dir:
        import quack.cache as qcache

        qcache.CACHE_DIR = cache_dir


def kernel_class(problem: GemmProblem | GroupedProblem) -> tuple:
    """What a compiled kernel takes from its problem: problems of one class share kernels (a
    grouped problem's class names its GEMM where a dense one's says whether it is batched)."""
    shape = problem.gemm if isinstance(problem, GroupedProblem) else problem.batch > 1
    return (problem.arch, problem.dtype, problem.out_dtype, problem.a_major, problem.b_major,
            shape)


def signature_class(problem: GemmProblem | GroupedProblem, config: KernelConfig) -> tuple:
    """Everything a compiled kernel depends on: its problem's ``kernel_class`` and config."""
    return (*kernel_class(problem), config.compile_key())


def compile_kernel(problem: GemmProblem | GroupedProblem, config: KernelConfig) -> float:
    """Compile (or find in quack's disk cache) the kernel for ``config``; return seconds."""
    from quack.gemm import _compile_gemm

    t0 = time.perf_counter()
    _compile_gemm(*kernel_signature(problem, config))
    return time.perf_counter() - t0
