"""``cutetune.grouped_mm``: torch._grouped_mm's MoE forms on quack's varlen kernels, with the
config the grouped cost model picks from host-known sizes (experts, routed rows, N, K), and
torch._grouped_mm wherever quack cannot run a call or the model expects ATen to win.

One custom op, ``cutetune::grouped_mm(a, b, offs, table)``, serves eager calls, CUDA graphs,
torch.compile and autograd. ``table`` is the config per range of the ragged size
(``problems.table_ints``), decided at compile time by Inductor's pass (``inductor.passes.GroupedMmPass``);
without one (eager) each call looks up the pick of its rung (``launcher.rung_of``), which the
model decides once per shape and rung: after that a call costs no model time and no GPU sync.
"""

from __future__ import annotations

import hashlib
import logging
from functools import partial
from pathlib import Path

import torch
from torch.utils import _python_dispatch

from ... import settings
from ...space.config import KernelConfig
from ...space.problem import GroupedProblem, ProblemError

from . import problems, runtime
from .compile import signature_class
from .launcher import M_UNBOUNDED, config_for_m, m_ranges, rung_of
from .problems import parsed_table
from .quack_gemm import MmPlan, launch

log = logging.getLogger(__name__)

# Rungs of a dynamic ragged size: routed rows reach 65536 tokens x top-8
RAGGED_RUNGS = tuple(2 ** i for i in range(21))


# ---------------------------------------------------------------- the model's picks
class Picker:
    """The grouped cost model's pick per problem: its top-1 config, or None where its ATen
    fallback expects torch._grouped_mm to win, its dataset never measured the problem's GEMM
    (``CostModel.prefers_aten``), or there is no model for the problem's arch/dtype.
    ``model``: a CostModel, a model file, or None for $CUTETUNE_GROUPED_MODEL, else the
    shipped one (``settings.grouped_model``), read once, at the first pick or digest, so that a
    compile's cache key names the model its picks come from (``set_model`` for another). Picks
    are kept; models load on first use, and not at all where the model file keeps the picks
    asked for (``CostModel.with_picks``)."""

    def __init__(self, model=None) -> None:
        self.model = model
        self.picks_: dict[GroupedProblem, KernelConfig | None] = {}
        self.models_: dict[tuple[str, str], object] = {}
        self.known_: dict[tuple[str, str], dict] = {}  # the picks each model file keeps
        self.source_: tuple | None = None  # (model or file or None: the packaged ones,)
        self.digest_: str | None = None

    def _source(self):
        if self.source_ is None:
            self.source_ = (self.model if self.model is not None else settings.grouped_model(),)
        return self.source_[0]

    def _model_for(self, arch: str, dtype: str):
        key = (arch, dtype)
        if key not in self.models_:
            from ...models.artifact import ModelError, load_model

            source = self._source()
            try:
                self.models_[key] = source if hasattr(source, "rank") else load_model(
                    source, arch, dtype, "grouped")
            except ModelError as e:
                log.warning("cutetune: grouped GEMMs on %s/%s run torch._grouped_mm (%s)",
                            arch, dtype, e)
                self.models_[key] = None
        return self.models_[key]

    def pick(self, problem: GroupedProblem) -> KernelConfig | None:
        self.pick_all([problem])
        return self.picks_[problem]

    def pick_all(self, problems: list[GroupedProblem]) -> None:
        """Pick for each of ``problems`` not picked yet: from the picks the model file keeps
        (``read_picks``: no XGBoost, no prediction), else from the model, asked once for them
        all (``CostModel.picks``)."""
        todo = [p for p in dict.fromkeys(problems) if p not in self.picks_]
        for arch, dtype in dict.fromkeys((p.arch, p.dtype) for p in todo):
            mine = [p for p in todo if (p.arch, p.dtype) == (arch, dtype)]
            known = self._known_for(arch, dtype)
            self.picks_.update((p, known[p.key()]) for p in mine if p.key() in known)
            mine = [p for p in mine if p.key() not in known]
            model = self._model_for(arch, dtype) if mine else None
            self.picks_.update(zip(mine, model.picks(mine) if model is not None
                                   else [None] * len(mine)))

    def _known_for(self, arch: str, dtype: str) -> dict:
        """The picks the model file for ``arch``/``dtype`` keeps; none from a model object or
        a file that cannot be read (``_model_for`` then says why)."""
        key = (arch, dtype)
        if key not in self.known_:
            from ...models.artifact import ModelError, read_picks

            source = self._source()
            try:
                self.known_[key] = {} if hasattr(source, "rank") else read_picks(
                    source, arch, dtype, "grouped")
            except ModelError:
                self.known_[key] = {}
        return self.known_[key]

    def has_model(self, arch: str, dtype) -> bool:
        """Whether there is a model for grouped GEMMs of ``arch`` in ``dtype`` (a torch dtype
        or its name)."""
        name = problems.TORCH_DTYPES.get(dtype, dtype)
        return name in problems.TORCH_DTYPES.values() and self._model_for(arch, name) is not None

    def ranked(self, problem: GroupedProblem, top_k: int) -> list[KernelConfig]:
        """The model's ``top_k`` configs for ``problem`` (reduced mode benchmarks them beside
        ATen, so no fallback here); none without a model."""
        model = self._model_for(problem.arch, problem.dtype)
        return [] if model is None else [c for c, _ in model.rank(problem, top_k=top_k)]

    def digest(self) -> str:
        """What identifies the picks (in Inductor's cache key): the model files' bytes, read
        once, as the models are loaded once."""
        if self.digest_ is None:
            source = self._source()
            if hasattr(source, "rank"):
                self.digest_ = f"model@{id(source):x}"
                return self.digest_
            packaged = settings.model_file_name("*", "*", "grouped")
            files = ([Path(source)] if source is not None
                     else sorted(settings.PACKAGE_DATA.glob(packaged)))
            h = hashlib.sha256()
            for f in files:  # the packaged ones: one per arch and dtype shipped
                try:
                    h.update(f.read_bytes())
                except OSError:
                    h.update(b"none")  # no model: its grouped GEMMs run ATen
            self.digest_ = h.hexdigest()[:16]
        return self.digest_

    def table(self, problem_at, dynamic: bool, total: int | None = None, kernels=None):
        """The config per range of the ragged size: for a static ``total``, the pick at it
        for every size; for a dynamic one, the pick at each rung (``launcher.m_ranges``).
        ``problem_at(size)`` is the problem at that ragged size (ProblemError: ATen).
        ``kernels``, a dict if given, gets each picked config with a problem it was picked
        for (one kernel serves every size)."""
        problems = {}  # size -> its problem, for the sizes quack can run
        for size in RAGGED_RUNGS if dynamic else (total,):
            try:
                problems[size] = problem_at(size)
            except ProblemError:
                pass
        self.pick_all(list(problems.values()))  # every size's at once

        def pick_at(size: int) -> KernelConfig | None:
            problem = problems.get(size)
            config = None if problem is None else self.picks_[problem]
            if config is not None and kernels is not None:
                kernels.setdefault(config, problem)
            return config

        if not dynamic:
            return ((M_UNBOUNDED, pick_at(total)),)
        return m_ranges(pick_at, RAGGED_RUNGS)


_PICKER = Picker()


def picker() -> Picker:
    """The picker eager calls use, and graphs compiled under an ``enable`` made after it was
    set (``set_model`` replaces it; an installation keeps the one it found)."""
    return _PICKER


def set_model(model=None) -> None:
    """Use ``model`` (a CostModel or a grouped model file; None: the default) for eager
    ``grouped_mm`` calls from now on."""
    global _PICKER
    _PICKER = Picker(model)
    _plans.clear()


def with_ragged(problem: GroupedProblem, size: int) -> GroupedProblem:
    """``problem`` with its ragged dimension's total set to ``size``."""
    field = "m" if problem.ragged == "m" else "k"
    d = problem.to_dict()
    d[field] = size
    return GroupedProblem(**d)


def ragged_total(problem: GroupedProblem) -> int:
    return problem.m if problem.ragged == "m" else problem.k


# ---------------------------------------------------------------- run time
_plans: dict[tuple, runtime.Plan] = {}
# signature_class -> how the compile helper's build of that kernel stands
# ("pending", "done" or "failed: why"), for kernels a compile handed to it (``building``)
_builds: dict[tuple, object] = {}


def building(problem: GroupedProblem, config: KernelConfig, state) -> None:
    """Record that the compile helper builds ``problem``'s kernel for ``config``; ``state()``
    says how that stands without waiting. Calls run ATen until it is built, rather than
    compile it here at their first launch. Filed as the helper files it (``signature_class``:
    one kernel serves every size, and configs that differ only in run-time knobs)."""
    _builds[signature_class(problem, config)] = state


class GroupedPlan(MmPlan):
    """``MmPlan`` with its kernel's ``signature_class``, for its build's state."""

    __slots__ = ("kernel",)

    def __init__(self, config: KernelConfig, problem: GroupedProblem) -> None:
        super().__init__(config, problem.arch)
        self.kernel = signature_class(problem, config)


def _build_plan(a, b, offs, table) -> runtime.Plan:
    try:
        problem = problems.grouped_call_problem(a, b, offs)
        total = ragged_total(problem)
        if table is not None:
            config = config_for_m(parsed_table(table), total)
        else:
            config = _PICKER.pick(with_ragged(problem, rung_of(total)))
        if config is None:
            return runtime.ATEN
        problems.check_config(config, problem.arch, problem)
    except ProblemError as e:
        log.info("cutetune: torch._grouped_mm for %s @ %s (%s)", tuple(a.shape), tuple(b.shape),
                 e)
        return runtime.ATEN
    return GroupedPlan(config, problem)


def _aten(a, b, offs, out=None):
    """torch._grouped_mm, contiguous as the op's fake says (it pads rows of unaligned N)."""
    return torch._grouped_mm(a, b, offs=offs).contiguous()


def _run(plan: MmPlan, a, b, offs, out) -> None:
    key = "cu_seqlens_m" if b.dim() == 3 else "cu_seqlens_k"
    cu = torch.nn.functional.pad(offs, (1, 0))  # quack's offsets start at 0
    launch(plan, a, b, out, None, 1.0, 1.0, **{key: cu})


class _Grouped:
    """The grouped GEMM's part of ``runtime.call``; a call is ``(a, b, offs, out)``."""

    aten = staticmethod(_aten)

    @staticmethod
    def pending(plan: GroupedPlan, call) -> bool:
        """A capture in progress (``runtime.capturing``), or the compile helper still building
        the kernel: the call runs ATen (the first such call says so)."""
        if runtime.capturing(plan, call):
            return True
        state = _builds.get(plan.kernel)
        if state is None or state() != "pending":
            return False
        return runtime.defer(plan, f"grouped GEMM {plan.config.short()}")

    @staticmethod
    def first_launch(plan: MmPlan, *call) -> None:
        _run(plan, *call)
        plan.run, plan.via = partial(_run, plan), "quack"

    @staticmethod
    def describe(plan, call) -> str:
        return (f"quack config {plan.config.short()} on the grouped {tuple(call[0].shape)} @ "
                f"{tuple(call[1].shape)}")


def _out_size(a_size, b_size, offs_size) -> list:
    """The output's sizes, from the operands' (ints, or Inductor's symbolic sizes)."""
    if len(b_size) == 3:
        return [a_size[0], b_size[-1]]
    return [offs_size[0], a_size[0], b_size[-1]]


def _key(a, b, offs, table) -> tuple:
    return (None if table is None else tuple(table), a.shape, a.stride(), b.shape, b.stride(),
            offs.shape, offs.dtype, a.dtype, b.dtype, a.device, b.device, offs.device)


def grouped_mm_impl(a, b, offs, table=None):
    """``torch._grouped_mm(a, b, offs=offs)`` on quack's kernel where the plan for this
    call's metadata has one (``table``: ints of the configs by range, None: the model's pick
    for the call's rung), else on ATen; contiguous either way."""
    key = _key(a, b, offs, table)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = _build_plan(a, b, offs, table)
    if plan.config is None:
        return _aten(a, b, offs)
    out = torch.empty(_out_size(a.shape, b.shape, offs.shape), dtype=a.dtype,
                      device=a.device)
    return runtime.call(_Grouped, _plans, key, plan, out, (a, b, out), (a, b, offs, out))


def launched_via(a, b, offs, table=None) -> str | None:
    """How calls with this metadata ran so far: "quack", or None (ATen, or none yet)."""
    plan = _plans.get(_key(a, b, offs, table))
    return None if plan is None else plan.via


# ---------------------------------------------------------------- the op
@torch.library.custom_op("cutetune::grouped_mm", mutates_args=())
def grouped_mm_op(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor,
                  table: list[int] | None = None) -> torch.Tensor:
    """See ``grouped_mm``; ``table`` as ``problems.table_ints`` writes it."""
    return grouped_mm_impl(a, b, offs, table)


@grouped_mm_op.register_fake
def _(a, b, offs, table=None):
    return a.new_empty(_out_size(a.shape, b.shape, offs.shape))


def _setup_context(ctx, inputs, output) -> None:
    a, b, offs, _ = inputs
    ctx.save_for_backward(a, b, offs)


def _backward(ctx, grad):
    """The input gradient is a varlen-M GEMM with W's other major, the weight gradient a
    varlen-K one: both grouped GEMMs of this op, each with its own pick. The weight gradient
    comes in the weight's layout: autograd would otherwise copy it into the parameter's
    strides, a transpose of every expert's weights per step."""
    a, b, offs = ctx.saved_tensors
    if b.dim() != 3:
        raise NotImplementedError("cutetune.grouped_mm differentiates the 2D x 3D (varlen M) "
                                  "form only")
    grad, grad_a, grad_b = grad.contiguous(), None, None  # sum()'s gradient is a broadcast
    if ctx.needs_input_grad[0]:
        grad_a = torch.ops.cutetune.grouped_mm(grad, b.mT, offs)
    if ctx.needs_input_grad[1]:  # in B's own layout: W (E, N, K) for B = W^T, no copy
        grad_b = (torch.ops.cutetune.grouped_mm(grad.mT, a, offs).mT if b.stride(-2) == 1
                  else torch.ops.cutetune.grouped_mm(a.mT, grad, offs))
    return grad_a, grad_b, None, None


grouped_mm_op.register_autograd(_backward, setup_context=_setup_context)


# The name under which Inductor's generated code calls the op's kernel (``install_lowering``)
GROUPED_MM_KERNEL = "cutetune_quack_grouped_mm"


def grouped_mm_extern(a, b, offs, *, table):
    """``cutetune::grouped_mm`` as generated code calls it, ``table`` a literal tuple."""
    return grouped_mm_impl(a, b, offs, table)


_extern: list = []


def extern_choice():
    """The op's ExternKernelChoice (``install_lowering`` registers it)."""
    install_lowering()
    return _extern[0]


def install_lowering() -> None:
    """Have Inductor lower the op as an extern kernel with a literal table, a plain function
    call: a custom op's call through the dispatcher costs compiled code host time per call
    (docs/design.md, the fused SwiGLU op). Once per process (the graph pass that puts tables
    into graphs installs it); under the C++ wrapper, which cannot call Python, the op stays a
    custom-op call."""
    if _extern:
        return
    from torch._inductor import ir
    from torch._inductor.lowering import fallback_handler, register_lowering
    from torch._inductor.virtualized import V

    from .launcher import register_extern

    op = torch.ops.cutetune.grouped_mm.default
    choice = register_extern(GROUPED_MM_KERNEL, grouped_mm_extern, out_variant=False)
    _extern.append(choice)

    def lowering(a, b, offs, table=None):
        if V.graph.cpp_wrapper or table is None:
            return fallback_handler(op, add_to_fallback_set=False)(a, b, offs, table)
        a, b, offs = (ir.ExternKernel.realize_input(t) for t in (a, b, offs))
        size = _out_size(a.get_size(), b.get_size(), offs.get_size())
        layout = ir.FixedLayout(a.get_device(), a.get_dtype(), size)
        return choice.bind([a, b, offs], layout, table=tuple(table)).output_node()

    register_lowering(op, type_promotion_kind=None)(lowering)


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """``torch._grouped_mm(a, b, offs=offs)`` for an MoE layer's expert GEMMs: ``a`` (M_total,
    K) rows grouped by expert, ``b`` (E, K, N) (``w.mT`` of a weight (E, N, K), or (E, K, N)
    itself), ``offs`` the int32 cumulative row counts (E,); or ``a`` (M, K_total) and ``b``
    (K_total, N) into (E, M, N). Differentiable, graph-capturable and traceable by
    torch.compile; ATen wherever quack cannot run the call. A call that needs no autograd
    and is not being traced skips the dispatcher, whose custom-op call costs host time."""
    if torch.compiler.is_compiling() or _python_dispatch._get_current_dispatch_mode() \
            or (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)):
        return torch.ops.cutetune.grouped_mm(a, b, offs)  # traced (make_fx too) or autograd
    return grouped_mm_impl(a, b, offs)
