"""Run quack's CuteDSL GEMM with a given KernelConfig for mm, addmm and bmm, falling back to
ATen for whatever quack cannot take, and expose it to Inductor as extern kernels.

A call launches through ``quack_gemm`` (one level below quack's public ``gemm``, which picks
its own config and takes no C operand) or, where the compile helper has built a plain mm's
kernel as a TVM-FFI library (``library``), from that library, and then this process never
imports quack. The path of every call (plan per metadata, ATen fallback, first launch) is
``runtime.call``'s.

The support envelope (dtype, majors, 16-byte TMA strides, addend shape) is a pure function of
sizes and strides (``problems``), shared with the compile-time decision in Inductor;
base-pointer alignment is only known at run time and is checked on every call.
"""

from __future__ import annotations

import logging
import math
from functools import partial

import torch

from ...space.config import KernelConfig
from ...space.problem import ProblemError

from . import aot, library as gemm_library, problems, runtime
from .quack_gemm import MmPlan, launch
from .problems import as_config

log = logging.getLogger(__name__)


# Names under which Inductor's generated code calls the kernels (extern_kernels.<name>).
MM_KERNEL = "cutetune_quack_mm"
ADDMM_KERNEL = "cutetune_quack_addmm"
# The same for a GEMM whose M is dynamic: a config per range of M (``config_for_m``)
MM_BY_M_KERNEL = "cutetune_quack_mm_by_m"
ADDMM_BY_M_KERNEL = "cutetune_quack_addmm_by_m"
M_UNBOUNDED = 2 ** 62  # the largest M of a table's last range: every M


# ---------------------------------------------------------------- run time
_plans: dict[tuple, runtime.Plan] = {}


def unsupported_reason(a, b, out, config, c=None, beta: float = 1.0) -> str | None:
    """Why quack cannot run this call of ``quack_mm_out``, or None when it can."""
    try:
        problems.call_problem(a, b, out, as_config(config), c, beta)
    except ProblemError as e:
        return str(e)
    return None


def _build_plan(a, b, out, config: KernelConfig, c, alpha, beta) -> runtime.Plan:
    try:
        problem, addend = problems.call_problem(a, b, out, config, c, beta)
    except ProblemError as e:
        log.info("cutetune: ATen for %s @ %s (%s)", tuple(a.shape), tuple(b.shape), e)
        return runtime.ATEN
    library = None
    if addend is None and alpha == 1 and a.dim() == 2 \
            and gemm_library.unsupported_reason(problem, config) is None:
        library = gemm_library.library_key(problem, config)
    return MmPlan(config, problem.arch, addend, library)


def _aten(a, b, out, c, alpha, beta):
    if c is not None:
        return torch.addmm(c, a, b, beta=beta, alpha=alpha, out=out)
    (torch.bmm if a.dim() == 3 else torch.mm)(a, b, out=out)
    return out if alpha == 1 else out.mul_(alpha)


class _Mm:
    """The plain GEMM's part of ``runtime.call``; a call is ``(a, b, out, c, alpha, beta)``."""

    aten = staticmethod(_aten)

    pending = staticmethod(runtime.capturing)

    @staticmethod
    def first_launch(plan: MmPlan, a, b, out, c, alpha, beta) -> None:
        """From the kernel's library where it has one built and it runs, else through quack
        (a failure there too reaches ``runtime.launch_first``, which retires the call to
        ATen)."""
        if plan.library is not None and aot.launch_from_library(
                plan, lambda: gemm_library.runner(plan.config, plan.library, a.device),
                (a, b, out, c, alpha, beta), "the kernel"):
            return
        launch(plan, a, b, out, c, alpha, beta)
        plan.run, plan.via = partial(launch, plan), "quack"

    @staticmethod
    def describe(plan, call) -> str:
        return (f"quack config {plan.config.short()} on {tuple(call[0].shape)} @ "
                f"{tuple(call[1].shape)}")


def quack_mm_out(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config,
                 c: torch.Tensor | None = None, alpha: float = 1.0,
                 beta: float = 1.0) -> torch.Tensor:
    """``out = alpha * (a @ b) + beta * c`` (``c`` optional: addmm's input) with quack's kernel
    for ``config`` (a KernelConfig or its field tuple); mm for 2D ``a``/``b``, bmm for 3D.

    Anything quack cannot take (dtype, device, strides, addend shape, a config invalid for the
    problem, an unaligned base pointer) runs ATen's out= variant instead, so the result is
    always right. A config whose first launch fails (compile error) is retired to ATen for that
    metadata with a warning.
    """
    key = (config, a.shape, a.stride(), b.shape, b.stride(), out.shape, out.stride(), a.dtype,
           out.dtype, a.device,
           None if c is None else (c.shape, c.stride(), c.dtype), alpha, beta)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = _build_plan(a, b, out, as_config(config), c, alpha, beta)
    return runtime.call(_Mm, _plans, key, plan, out, (a, b, out, c), (a, b, out, c, alpha, beta))


# ---------------------------------------------------------------- Inductor extern kernels
def _cutetune_quack_mm(a, b, *, out, config):
    return quack_mm_out(a, b, out, config)


def _cutetune_quack_addmm(inp, a, b, *, out, config, alpha=1, beta=1):
    return quack_mm_out(a, b, out, config, c=inp, alpha=alpha, beta=beta)


# The M at which a GEMM whose M is dynamic is decided (``m_ranges``): every power of two up to
# the heuristics grid's last M (their cells are that fine in M); the last rung's decision
# holds beyond it.
M_RUNGS = tuple(2 ** i for i in range(16))


def rung_of(m: int) -> int:
    """The power of two nearest ``m`` in log space: the rung whose range (``m_ranges``) holds
    ``m``, ``M * M <= 2 * rung * rung``."""
    low = 1 << max(m.bit_length() - 1, 0)
    return low if m * m <= 2 * low * low else 2 * low


def m_ranges(pick_at, rungs=M_RUNGS) -> tuple[tuple[int, object], ...]:
    """``pick_at(m)`` at each of ``rungs`` (ascending powers of two), merged into ranges
    ``(largest M, pick)`` in ascending M: a rung's range holds the M nearest it in log space
    (``rung_of``), the last range every M above (``M_UNBOUNDED``)."""
    table: list[tuple[int, object]] = []
    for m in rungs:
        pick, m_max = pick_at(m), math.isqrt(2 * m * m)
        if table and table[-1][1] == pick:
            table[-1] = (m_max, pick)
        else:
            table.append((m_max, pick))
    table[-1] = (M_UNBOUNDED, table[-1][1])
    return tuple(table)


def config_for_m(table, m: int):
    """The config (field tuple, or None for ATen) of the range of ``table`` that holds ``m``:
    ``table`` is ``((largest M, config or None), ...)`` in ascending M, its last range
    unbounded (``inductor.by_m_table``)."""
    for m_max, config in table:
        if m <= m_max:
            return config
    raise ValueError(f"M={m} is beyond the table's last range ({table[-1][0]})")


def _cutetune_quack_mm_by_m(a, b, *, out, table):
    return _cutetune_quack_addmm_by_m(None, a, b, out=out, table=table)


def _cutetune_quack_addmm_by_m(inp, a, b, *, out, table, alpha=1, beta=1):
    config = config_for_m(table, a.shape[0])
    if config is None:
        return _aten(a, b, out, inp, alpha, beta)
    return quack_mm_out(a, b, out, config, c=inp, alpha=alpha, beta=beta)


_extern: dict[str, object] = {}


def extern_choices() -> dict[str, object]:
    """Inductor ExternKernelChoices for mm/bmm and addmm, with one config or (``_BY_M``) one
    per range of a dynamic M, registered once per process.

    Generated code calls ``extern_kernels.cutetune_quack_mm(a, b, config=(...), out=buf)``: a
    name registered when this runs (cutetune.tuner.inductor.choices runs it on import) and a literal
    config, so code reloaded from Inductor's FX-graph cache in a fresh process resolves it as
    soon as cutetune is enabled there, which a cache hit requires anyway (the installed choices
    are part of the cache key)."""
    if not _extern:
        for name, fn in ((MM_KERNEL, _cutetune_quack_mm), (ADDMM_KERNEL, _cutetune_quack_addmm),
                         (MM_BY_M_KERNEL, _cutetune_quack_mm_by_m),
                         (ADDMM_BY_M_KERNEL, _cutetune_quack_addmm_by_m)):
            _extern[name] = register_extern(name, fn)
    return _extern


def register_extern(name: str, fn, out_variant: bool = True):
    """An Inductor ExternKernelChoice (``fn`` writes ``out=`` where ``out_variant``, else
    returns its result) that generated code calls as ``extern_kernels.<name>``, registered
    under that name."""
    from torch._inductor.select_algorithm import ExternKernelChoice, extern_kernels

    if hasattr(extern_kernels, name):  # a reloaded module re-registers its kernels
        delattr(extern_kernels, name)
    return ExternKernelChoice(fn, name=name, has_out_variant=out_variant)
