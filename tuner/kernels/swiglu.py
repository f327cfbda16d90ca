"""SwiGLU's up projection with the gate fused in: ``silu(gate) * (a @ b)`` as one quack GEMM
whose epilogue reads ``gate`` as its C operand (``quack_epilogues.silu_mul``).

A decoder MLP computes ``silu(x @ Wg) * (x @ Wu)`` as two GEMMs and a pointwise kernel that
reads both products back and writes the result: 3*M*N elements of memory traffic that
Inductor cannot fuse into an extern GEMM (cuBLAS or quack). Fused, the up projection's
epilogue reads the gate product while it writes its own result, and neither the up product
nor the pointwise kernel exists. ``pointwise_share`` prices what that saves at the device's
ceilings; ``fusion_config`` decides where to fuse; the Inductor pass that rewrites graphs
is ``tuner/inductor/passes.py``.

The custom op ``cutetune::mm_silu_mul`` (``cutetune::mm_silu_mul_by_m`` for a dynamic M) is
what a rewritten graph holds; Inductor lowers it as an extern kernel (``install_lowerings``),
so generated code (also reloaded from the FX-graph cache) calls ``mm_silu_mul_out`` by name.
It launches the kernel from its TVM-FFI library (``aot.py``, ``build_library``) where one is
built, without importing quack; runs unfused ("ATen" below: cuBLAS's mm, then the product in
one pass, ``pointwise.py``) while the compile helper builds it; and goes through quack
otherwise.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import torch

from ...space.config import KernelConfig
from ...space.problem import ProblemError

from . import aot, pointwise, problems, runtime
from .launcher import config_for_m, register_extern
from .problems import TORCH_DTYPES, as_config, config_from_ints, config_tuple, parsed_table

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- run time
_plans: dict[tuple, runtime.Plan] = {}
# Library builds under way: ``aot.kernel_key`` -> its state ("pending", "done" or
# "failed: why"), registered by whoever started them (Inductor's compile helper). While a
# call's build is pending the call runs ATen, unfused, and the next call looks again: the
# model never waits for a compile (``inductor.prepare_fused_kernel`` says why).
_builds: dict[str, Callable[[], str]] = {}


def library_spec(config: KernelConfig, arch: str, dtype: torch.dtype,
                 majors: tuple[str, str]) -> dict:
    """What the fused kernel's TVM-FFI library is (``aot.kernel_key``'s spec), for A and B of
    these majors (``GemmProblem.a_major``, ``b_major``): the compiled kernel is specific to
    them."""
    return {"kind": f"swiglu-{majors[0]}{majors[1]}", "config": config.to_dict(), "arch": arch,
            "dtype": TORCH_DTYPES[dtype]}


def library_key(config: KernelConfig, arch: str, dtype: torch.dtype,
                majors: tuple[str, str]) -> str:
    """The fused kernel's TVM-FFI library name."""
    return aot.kernel_key(library_spec(config, arch, dtype, majors))


def building(key: str, state: Callable[[], str]) -> None:
    """Record that the library ``key`` is being built; ``state()`` says how that stands
    ("pending", "done" or "failed: why") without waiting."""
    _builds[key] = state


def unsupported_reason(a, b, gate, out, config) -> str | None:
    """Why the fused kernel cannot run this call (from metadata), or None when it can."""
    try:
        problems.fused_call_problem(a, b, gate, out, as_config(config))
    except ProblemError as e:
        return str(e)
    return None


def _aten(a, b, gate, out):
    """Unfused: cuBLAS's mm, then the product in one pass (``pointwise.silu_mul_``)."""
    torch.mm(a, b, out=out)
    return pointwise.silu_mul_(out, gate)


def _build_pending(plan: runtime.Plan, device: torch.device) -> bool:
    """Whether the compile helper is still building ``plan``'s library (or the stream is
    being captured into a CUDA graph, where no library is loaded): the call then runs ATen.
    The first such call says so."""
    state = _builds.get(plan.library)
    if state is None:
        return False
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if state() != "pending" and not capturing:
        return False
    return runtime.defer(plan, f"fused SwiGLU {plan.config.short()}")


def _library_runner(config: KernelConfig, key: str, device):
    """``run`` through the kernel's TVM-FFI library ``key`` when it is built (or linked from
    prebuilt objects), else None."""
    lib = aot.load(key, device, config.cluster_size, "the fused kernel")
    if lib is None:
        return None
    log.info("cutetune: fused SwiGLU %s runs from its TVM-FFI library", config.short())
    return lambda a, b, gate, out: lib.launch(a, b, out, gate)


def _quack_runner(config: KernelConfig, a, b, gate, out):
    """``run`` through quack's epilogue frontend (imports quack; compiles on a cold cache)."""
    from .epilogues import silu_mul

    plan = silu_mul.plan(a, b, gate, out={"D": out}, config=config.to_quack(problems.device_arch(a.device)),
                         dynamic_scheduler=config.is_dynamic_persistent)
    return lambda a, b, gate, out: plan.run(a, b, gate, out={"D": out})


def _first_launch(plan: runtime.Plan, a, b, gate, out) -> None:
    """Launch from the kernel's library if it loads and runs, else through quack (a failure
    there too reaches ``runtime.launch_first``, which retires the call to ATen): the helper's build
    failed, or it had none to do (no C compiler, quack's disk cache off)."""
    if aot.launch_from_library(plan, lambda: _library_runner(plan.config, plan.library,
                                                             a.device),
                               (a, b, gate, out), "the fused kernel"):
        return
    run = _quack_runner(plan.config, a, b, gate, out)
    run(a, b, gate, out)
    plan.run, plan.via = run, "quack"


def _key(a, b, gate, out, config) -> tuple:
    return (config, a.shape, a.stride(), b.shape, b.stride(), gate.shape, gate.stride(),
            out.shape, out.stride(), a.dtype, out.dtype, a.device)


def launched_via(a, b, gate, out, config) -> str | None:
    """How calls with this metadata ran the fused kernel so far: "library" (its TVM-FFI
    library) or "quack"; None where they ran ATen or nothing yet."""
    plan = _plans.get(_key(a, b, gate, out, config))
    return None if plan is None else plan.via


def _cpu_plan(config: KernelConfig, arch: str, dtype: torch.dtype, majors: tuple[str, str],
              clusters: int):
    """quack's launch plan of the fused kernel, built in a process made GPU-blind by
    ``compile.configure_gpu_blind`` (it compiles the kernel, or finds it in quack's disk
    cache), on ``aot.cpu_operands`` of the runtime's dtype and operand majors (nn.Linear's
    weight gives B "k"). Building the plan then asks the driver how many clusters fit;
    ``clusters`` answers."""
    from quack.gemm_runtime import host

    from .epilogues import silu_mul

    a, b, out = aot.cpu_operands(dtype, majors)
    gate = torch.empty_like(out)
    asked = host.get_max_active_clusters
    host.get_max_active_clusters = lambda cluster_size: clusters
    try:
        return silu_mul.plan(a, b, gate, out={"D": out}, config=config.to_quack(arch),
                             dynamic_scheduler=config.is_dynamic_persistent)
    finally:
        host.get_max_active_clusters = asked


def build_library(config: KernelConfig, arch: str, dtype: torch.dtype,
                  majors: tuple[str, str]) -> float:
    """Compile the fused kernel with quack and keep it as a TVM-FFI library (``aot.build``),
    in a GPU-blind process; seconds taken."""
    t0 = time.perf_counter()
    aot.build(library_key(config, arch, dtype, majors),
              lambda: _cpu_plan(config, arch, dtype, majors, aot.CLUSTERS_SENTINEL))
    return time.perf_counter() - t0


class _Fused:
    """The fused kernel's part of ``runtime.call``; a call is ``(a, b, gate, out)``."""

    aten = staticmethod(lambda a, b, gate, out: _aten(a, b, gate, out))
    pending = staticmethod(lambda plan, call: _build_pending(plan, call[0].device))
    first_launch = staticmethod(lambda plan, a, b, gate, out: _first_launch(plan, a, b, gate, out))

    @staticmethod
    def describe(plan, call) -> str:
        return (f"fused SwiGLU config {plan.config.short()} on {tuple(call[0].shape)} @ "
                f"{tuple(call[1].shape)}")


def quack_mm_silu_mul_out(a: torch.Tensor, b: torch.Tensor, gate: torch.Tensor,
                          out: torch.Tensor, config) -> torch.Tensor:
    """``out = silu(gate) * (a @ b)`` with quack's fused kernel for ``config`` (a
    KernelConfig or its field tuple), from its TVM-FFI library where one is built (no quack
    import), with ATen while the compile helper builds it, else through quack. Anything the
    kernel cannot take (see ``unsupported_reason``, or an unaligned base pointer) runs ATen
    instead, and a config whose first launch fails is retired to ATen for that metadata with
    a warning."""
    key = _key(a, b, gate, out, config)
    plan = _plans.get(key)
    if plan is None:
        config = as_config(config)
        try:
            p = problems.fused_call_problem(a, b, gate, out, config)
            plan = runtime.Plan(config, library_key(config, p.arch, a.dtype, (p.a_major, p.b_major)))
        except ProblemError as e:
            log.info("cutetune: ATen for silu(gate) * %s @ %s (%s)", tuple(a.shape),
                     tuple(b.shape), e)
            plan = runtime.ATEN
        _plans[key] = plan
    return runtime.call(_Fused, _plans, key, plan, out, (a, b, gate, out), (a, b, gate, out))


# ---------------------------------------------------------------- the op graphs call
# Names under which Inductor's generated code calls the two ops (``install_lowerings``)
MM_SILU_MUL_KERNEL = "cutetune_quack_mm_silu_mul"
MM_SILU_MUL_BY_M_KERNEL = "cutetune_quack_mm_silu_mul_by_m"


def mm_silu_mul_out(a, b, gate, *, out, config):
    """``cutetune::mm_silu_mul`` into ``out``: what generated code calls."""
    return quack_mm_silu_mul_out(a, b, gate, out, config)


def mm_silu_mul_by_m_out(a, b, gate, *, out, table):
    """``cutetune::mm_silu_mul_by_m`` into ``out``, ``table`` as ``(largest M, config or
    None)`` ranges: what generated code calls."""
    config = config_for_m(table, a.shape[0])
    if config is None:
        return _aten(a, b, gate, out)
    return quack_mm_silu_mul_out(a, b, gate, out, config)


@torch.library.custom_op("cutetune::mm_silu_mul", mutates_args=())
def mm_silu_mul(a: torch.Tensor, b: torch.Tensor, gate: torch.Tensor,
                config: list[int]) -> torch.Tensor:
    """``silu(gate) * (a @ b)`` with quack's fused kernel for ``config`` (``problems.config_ints``)."""
    out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
    return mm_silu_mul_out(a, b, gate, out=out, config=config_from_ints(config))


@torch.library.custom_op("cutetune::mm_silu_mul_by_m", mutates_args=())
def mm_silu_mul_by_m(a: torch.Tensor, b: torch.Tensor, gate: torch.Tensor,
                     table: list[int]) -> torch.Tensor:
    """``silu(gate) * (a @ b)`` for an M known only at run time: fused with the config of
    the range of ``table`` (``problems.table_ints``) holding this call's M, or unfused (ATen) where
    that range has none."""
    out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
    return mm_silu_mul_by_m_out(a, b, gate, out=out, table=parsed_table(table))


_externs: dict[str, object] = {}


def install_lowerings() -> None:
    """Have Inductor lower both ops as extern kernels: generated code then calls
    ``mm_silu_mul_out`` / ``mm_silu_mul_by_m_out`` by name (``MM_SILU_MUL_KERNEL``, ...) with
    a literal config or table, a plain function call. As custom ops called through the
    dispatcher, compiled code paid about 50 us of host time more per call on the H200 host
    (data/bench/op_overhead_h200.json), which a dynamic-M graph pays at every M, fused or
    not. Once per process: the fusion pass, which puts the ops into graphs, installs it;
    code reloaded from the FX-graph cache finds the kernels by name once it has. Under the
    C++ wrapper, which cannot call Python, the ops stay custom-op calls."""
    if _externs:
        return
    from torch._inductor import ir
    from torch._inductor.lowering import fallback_handler, register_lowering
    from torch._inductor.virtualized import V

    def by_m_kwargs(ints):
        return {"table": tuple((m, None if c is None else config_tuple(c))
                               for m, c in parsed_table(ints))}

    for op, name, fn, kwargs_of in (
            (torch.ops.cutetune.mm_silu_mul.default, MM_SILU_MUL_KERNEL, mm_silu_mul_out,
             lambda ints: {"config": config_tuple(config_from_ints(ints))}),
            (torch.ops.cutetune.mm_silu_mul_by_m.default, MM_SILU_MUL_BY_M_KERNEL,
             mm_silu_mul_by_m_out, by_m_kwargs)):
        choice = _externs[name] = register_extern(name, fn)

        def lowering(a, b, gate, ints, op=op, choice=choice, kwargs_of=kwargs_of):
            if V.graph.cpp_wrapper:
                return fallback_handler(op, add_to_fallback_set=False)(a, b, gate, ints)
            a, b, gate = (ir.ExternKernel.realize_input(t) for t in (a, b, gate))
            layout = ir.FixedLayout(a.get_device(), a.get_dtype(),
                                    [a.get_size()[0], b.get_size()[1]])
            return choice.bind([a, b, gate], layout, **kwargs_of(ints)).output_node()

        register_lowering(op, type_promotion_kind=None)(lowering)


@mm_silu_mul.register_fake
def _(a, b, gate, config):
    return a.new_empty(a.shape[0], b.shape[1])


@mm_silu_mul_by_m.register_fake
def _(a, b, gate, table):
    return a.new_empty(a.shape[0], b.shape[1])
