"""SwiGLU's up projection with the gate fused in: ``silu(gate) * (a @ b)`` as one quack GEMM
whose epilogue reads ``gate`` as its C operand (``quack_epilogues.silu_mul``).

A decoder MLP computes ``silu(x @ Wg) * (x @ Wu)`` as two GEMMs and a pointwise kernel that
reads both products back and writes the result: 3*M*N elements of memory traffic that
Inductor cannot fuse into an extern GEMM (cuBLAS or quack). Fused, the up projection's
epilogue reads the gate product while it writes its own result, and neither the up product
nor the pointwise kernel exists. ``pointwise_share`` prices what that saves at the device's
ceilings; ``fusion_config`` decides where to fuse; the Inductor pass that rewrites graphs
is ``fusion_pass.py``.

The custom op ``cutetune::mm_silu_mul`` is what a rewritten graph calls; Inductor lowers it as
a fallback kernel, so generated code (also reloaded from the FX-graph cache) calls it by name
once cutetune is imported.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from functools import lru_cache

import torch
import torch.nn.functional as F

from cutetune.space.config import KernelConfig
from cutetune.space.device import device_for
from cutetune.space.features import ceiling_times_s
from cutetune.space.problem import DTYPE_BYTES, GemmProblem, ProblemError
from cutetune.space.rules import is_valid

from .launcher import (_aligned, as_config, check_config, check_out, config_tuple, device_arch,
                       gemm_problem, in_background, launch_first)

log = logging.getLogger(__name__)

# Fuse an unmeasured up projection only where the pointwise kernel's traffic, at the device's
# ceilings, is at least this share of the GEMM's own ceiling time: fusing trades cuBLAS for
# quack's kernel. On the H200 (data/bench/swiglu_h200.json, swiglu_families_h200.json) the
# rule's config beat the unfused default on 11 of the 13 shapes at or above it (13-18 %), and
# at Llama-3-70B's 6.7 % ran 1.023, 0.960 and 0.938x at M 1024, 2048 and 4096.
MIN_POINTWISE_SHARE = 0.08


# ---------------------------------------------------------------- decisions (pure)
def pointwise_share(problem: GemmProblem) -> float:
    """Time of the unfused pointwise kernel's 3*M*N elements at the device's memory
    ceiling, over the GEMM's time at its ceiling (the larger of flops and bytes)."""
    dev = device_for(problem.arch)
    compute_s, memory_s = ceiling_times_s(problem, dev)
    pointwise_s = (3 * problem.m * problem.n * DTYPE_BYTES[problem.out_dtype]
                   / dev.mem_bw_bytes_per_s)
    return pointwise_s / max(compute_s, memory_s)


def fusion_config(problem: GemmProblem, heuristics) -> KernelConfig | None:
    """The quack config to run ``silu(gate) * (a @ b)`` with for ``problem`` (the up
    projection), or None to leave the graph as it is. A problem the heuristics' SwiGLU table
    measured takes what the GPU said (``measured_fusions``). Otherwise: the heuristics' best
    valid config for the plain GEMM without split-K (a split K would apply silu to partial
    sums), where the saved pointwise traffic is worth at least ``MIN_POINTWISE_SHARE`` of the
    GEMM."""
    if problem.batch != 1:
        return None
    measured = getattr(heuristics, "swiglu_config", None)
    if measured is not None:
        known, config = measured(problem)
        if known:
            return config
    if pointwise_share(problem) < MIN_POINTWISE_SHARE:
        return None
    configs, _ = heuristics.lookup(problem)
    for c in configs:
        if c.split_k == 1 and is_valid(c, problem.arch, problem):
            return c
    return None


def measured_fusions(bench: dict, arch: str, dtype: str) -> dict[str, KernelConfig | None]:
    """From a ``scripts/swiglu_bench.py`` result: per up projection on (arch, dtype), the
    fused config that ran it fastest (ok numerics, quack's kernel not the ATen fallback) where
    that beat the unfused default measured beside it, else None. Chosen and scored on the
    same timings, like the dataset's exact entries."""
    out: dict[str, KernelConfig | None] = {}
    for shape in bench["shapes"]:
        problem = GemmProblem(**shape["problem"])
        if (problem.arch, problem.dtype) != (arch, dtype):
            continue
        ok = [r for r in shape["rows"] if r.get("status") == "ok"]
        unfused = [r["time_ms"] for r in ok if r["variant"] == "cublas+pointwise"]
        fused = sorted((r["time_ms"], KernelConfig.from_dict(r["config"])) for r in ok
                       if r["variant"] == "fused" and r.get("ran_quack"))
        if not unfused:
            continue
        best = fused[0] if fused else None
        out[problem.key()] = best[1] if best and best[0] < unfused[0] else None
    return out


# ---------------------------------------------------------------- run time
def _import_epilogues() -> None:
    t0 = time.perf_counter()
    import cutetune.tuner.quack_epilogues  # noqa: F401

    log.info("cutetune: imported quack's epilogues in %.2f s", time.perf_counter() - t0)


@lru_cache(maxsize=None)
def import_epilogues_in_background() -> threading.Thread:
    """``launcher.in_background`` for the fused epilogue's quack modules, once per process."""
    return in_background(_import_epilogues, "quack-epilogues")


class _Plan:
    __slots__ = ("config", "epi_plan")

    def __init__(self, config: KernelConfig | None) -> None:
        self.config = config
        self.epi_plan = None


_ATEN = _Plan(None)
_plans: dict[tuple, _Plan] = {}


def unsupported_reason(a, b, gate, out, config) -> str | None:
    """Why the fused kernel cannot run this call (from metadata), or None when it can."""
    config = as_config(config)
    arch = device_arch(a.device)
    try:
        if any(t.device != a.device for t in (b, gate, out)):
            raise ProblemError("operands are on different devices")
        if a.dim() != 2:
            raise ProblemError("the fused SwiGLU GEMM is for 2D operands only")
        problem = gemm_problem(a.shape, a.stride(), b.shape, b.stride(), a.dtype, out.dtype, arch)
        for name, t in (("out", out), ("gate", gate)):
            if tuple(t.shape) != (problem.m, problem.n) or t.dtype != out.dtype:
                raise ProblemError(f"{name} is {tuple(t.shape)} {t.dtype}, expected "
                                   f"{(problem.m, problem.n)} {out.dtype}")
            check_out(t.shape, t.stride(), t.dtype)
        if config.split_k != 1:
            raise ProblemError("split-K would apply silu to partial sums")
        check_config(config, arch, problem)
    except ProblemError as e:
        return str(e)
    return None


def _aten(a, b, gate, out):
    torch.mm(a, b, out=out)
    return out.mul_(F.silu(gate))


def _launch(plan: _Plan, a, b, gate, out) -> None:
    if plan.epi_plan is None:
        from cutetune.tuner.quack_epilogues import silu_mul

        cfg = plan.config
        plan.epi_plan = silu_mul.plan(a, b, gate, out={"D": out},
                                      config=cfg.to_quack(device_arch(a.device)),
                                      dynamic_scheduler=cfg.is_dynamic_persistent)
    plan.epi_plan.run(a, b, gate, out={"D": out})


def _key(a, b, gate, out, config) -> tuple:
    return (config, a.shape, a.stride(), b.shape, b.stride(), gate.shape, gate.stride(),
            out.shape, out.stride(), a.dtype, out.dtype, a.device)


def runs_quack(a, b, gate, out, config) -> bool:
    """Whether calls with this metadata have run quack's kernel (not ATen) so far."""
    plan = _plans.get(_key(a, b, gate, out, config))
    return plan is not None and plan.epi_plan is not None


def compile_kernel(config: KernelConfig, arch: str, dtype: torch.dtype = torch.bfloat16
                   ) -> float:
    """Compile (or find in quack's disk cache) the fused kernel for ``config`` in a process
    made GPU-blind by ``compile.configure_gpu_blind``; seconds taken. The kernel is compiled
    for symbolic sizes, so small CPU tensors of the runtime's dtypes and majors (A row-major,
    B nn.Linear's transposed weight) stand for every problem. Building the launch plan then
    asks the driver how many clusters fit; the compile is done by then, and the plan is not
    kept, so that question gets a placeholder answer here."""
    from quack.gemm_runtime import host

    from cutetune.tuner.quack_epilogues import silu_mul

    a, w, gate, out = (torch.empty(s, dtype=dtype) for s in ((256, 128), (256, 128),
                                                           (256, 256), (256, 256)))
    asked = host.get_max_active_clusters
    host.get_max_active_clusters = lambda cluster_size: 1
    t0 = time.perf_counter()
    try:
        silu_mul.plan(a, w.t(), gate, out={"D": out}, config=config.to_quack(arch),
                      dynamic_scheduler=config.is_dynamic_persistent)
    finally:
        host.get_max_active_clusters = asked
    return time.perf_counter() - t0


def quack_mm_silu_mul_out(a: torch.Tensor, b: torch.Tensor, gate: torch.Tensor,
                          out: torch.Tensor, config) -> torch.Tensor:
    """``out = silu(gate) * (a @ b)`` with quack's fused kernel for ``config`` (a
    KernelConfig or its field tuple). Anything the kernel cannot take (see
    ``unsupported_reason``, or an unaligned base pointer) runs ATen instead, and a config whose
    first launch fails is retired to ATen for that metadata with a warning."""
    key = _key(a, b, gate, out, config)
    plan = _plans.get(key)
    if plan is None:
        reason = unsupported_reason(a, b, gate, out, config)
        if reason is not None:
            log.info("cutetune: ATen for silu(gate) * %s @ %s (%s)", tuple(a.shape),
                     tuple(b.shape), reason)
        plan = _plans[key] = _ATEN if reason else _Plan(as_config(config))
    if plan.config is None or out.numel() == 0 or not _aligned(a, b, gate, out):
        return _aten(a, b, gate, out)
    if plan.epi_plan is not None:
        _launch(plan, a, b, gate, out)
        return out
    if not launch_first(lambda: _launch(plan, a, b, gate, out),
                        f"fused SwiGLU config {plan.config.short()} on {tuple(a.shape)} @ "
                        f"{tuple(b.shape)}"):
        _plans[key] = _ATEN
        return _aten(a, b, gate, out)
    return out


# ---------------------------------------------------------------- the op graphs call
def config_ints(config: KernelConfig) -> list[int]:
    """A config as the int list the custom op's schema carries."""
    return [int(v) for v in config_tuple(config)]


@torch.library.custom_op("cutetune::mm_silu_mul", mutates_args=())
def mm_silu_mul(a: torch.Tensor, b: torch.Tensor, gate: torch.Tensor,
                config: list[int]) -> torch.Tensor:
    """``silu(gate) * (a @ b)`` with quack's fused kernel for ``config`` (``config_ints``)."""
    cfg = KernelConfig.from_dict(dict(zip((f.name for f in dataclasses.fields(KernelConfig)),
                                          config)))
    out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
    return quack_mm_silu_mul_out(a, b, gate, out, cfg)


@mm_silu_mul.register_fake
def _(a, b, gate, config):
    return a.new_empty(a.shape[0], b.shape[1])
