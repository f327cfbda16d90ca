"""torch.compile integration: quack's CuteDSL GEMMs as Inductor choices for mm, addmm and bmm.

Inductor (2.11 to 2.13) has no CuteDSL GEMM for Hopper. We add one without patching torch:
``enable()`` installs an ``InductorChoices`` subclass through
``torch._inductor.config.inductor_choices_class``; its ``get_template_configs`` replaces the
candidate list of every mm/addmm/bmm node it can serve with extern-kernel choices calling
``launcher.quack_mm_out`` with one config each.

Modes:
  predicted  one choice per node: the heuristics' top-1 config, or ATen when the model
             prefers cuBLAS (for a host-bound GEMM, see below, the heuristics' Triton
             config or ATen). A single choice is never benchmarked
             (``AlgorithmSelectorCache.__call__`` returns it as is), so compiling costs a table
             lookup plus the kernel compile, which quack caches on disk.
  reduced    the top-k configs plus ATen, benchmarked by Inductor; ``feedback=PATH`` appends
             those timings to a cutetune dataset. The top-k kernels of a graph's GEMMs go to
             parallel compile workers (``prefetch.py``) from Dynamo's graph, before AOTAutograd
             (a pre-grad pass, ``early_prefetch.py``), and any it missed when the graph's
             first GEMM node is lowered, so they compile at once instead of one by one in the
             benchmark.
  off        nothing installed (an active cutetune installation is lifted for the block).
A 2D mm/addmm whose M alone is dynamic gets, in both modes, one choice that runs predicted
mode's config for the range of M holding each call's M (``by_m_choices``). Nodes quack cannot
run (dtype, layout, alignment, other dynamic sizes, a GPU other than sm90/sm100) keep
Inductor's own candidates: ATen alone under default settings. Both modes leave to
Inductor the GEMMs too small to cover a quack launch's host time (``QUACK_LAUNCH_HOST_US``)
unless the graph runs under CUDA graphs: the cost model and Inductor's benchmark time the GPU
only, and at small M a step without CUDA graphs waits on the host. Where such a plain mm is
also memory-bound, predicted mode gives it the one Triton config that the heuristics file
names for it (measured by scripts/triton_mm_sweep.py and scripts/triton_mm_retime.py, fitted
by models/triton_mm.py), and reduced mode the same where the retime measured the shape, else
benchmarks Inductor's Triton mm templates, but only for the mm that the
heuristics' launch costs give them, weighing all such mm of a graph together
(``graph_triton``); the others keep ATen. A Triton launch
from generated code costs less host time than ATen's extern call, and the template takes the
node's pointwise epilogue, but on the GPU it mostly runs longer than cuBLAS
(data/triton_mm/h200_bf16_retimed_top4.jsonl), and on compute-bound GEMMs much longer
(data/bench/step_h200_hostbound.json).

Both modes also install a post-grad pass (``fusion_pass.py``) that runs a SwiGLU MLP's
``silu(gate) * (x @ W_up)`` as one quack GEMM with the product in its epilogue
(``swiglu.py``), where the up projection is not host-bound and the heuristics say so: Inductor
cannot fuse the pointwise kernel into an extern GEMM, and cuBLAS has no such kernel.

Compile-time decisions come from the heuristics file (``heuristics.py``), not the cost model,
so lowering stays cheap. The installed choices are part of Inductor's FX-graph cache key
(``uuid()`` on 2.13, the pickled factory on 2.11): mode, top-k, the heuristics' digest and
a digest of the code that makes the decisions.

Compilation is lazy: a function compiled inside ``with enable(...)`` must also be first *called*
there, or Inductor compiles it after the block with the previous choices.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
import time
import uuid as uuidlib
import weakref
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import sympy
import torch
from torch._inductor import config as inductor_config
from torch._inductor import virtualized
from torch._inductor.choices import InductorChoices
from torch._inductor.select_algorithm import (
    ExternKernelCaller,
    ExternKernelChoice,
    get_algorithm_selector_cache,
)
from torch._inductor.utils import use_aten_gemm_kernels
from torch._inductor.virtualized import V

import cutetune
from cutetune.space.config import KernelConfig
from cutetune.space.device import device_for
from cutetune.space.features import ceiling_times_s
from cutetune.space.problem import GemmProblem, ProblemError
from cutetune.space.rules import is_valid

from . import aot, launcher, swiglu, template_cache
from .early_prefetch import EarlyPrefetchPass, operand_problem
from .fusion_pass import SwigluFusionPass
from .heuristics import Heuristics, HeuristicsError, ModelHeuristics, PackagedHeuristics
from .measure import environment
from .prefetch import is_library, kernel_key, shared_prefetcher, start_for_this_gpu
from .triton_timings import append_row, sweep_row

log = logging.getLogger(__name__)

MODES = ("predicted", "reduced", "off")
# CuteDSL candidates per node in reduced mode: on held-out problems the best of the shipped
# ranker's top 5 reaches a geomean 0.998 of the measured best (data/reports/model_h200_bf16/
# metrics.json, top-5), and the replay bench's guided search reaches 0.99 of the oracle after a
# median of 2 kernels (data/reports/replay_sm90_bf16.md): 5 leaves room beyond that median.
REDUCED_TOP_K = 5
# op name -> uid of ATen's own kernel for it: the template whose get_template_configs call we
# answer. Other ATen variants (mm with out_dtype, bias_addmm) are left to Inductor.
PRIMARY_ATEN = {"mm": "aten::mm", "addmm": "aten::addmm", "bmm": "aten::bmm"}
ATEN_KERNELS = ("mm", "addmm", "bmm", "bias_addmm")  # extern names whose timings are cuBLAS
FEEDBACK_SUITE = "inductor_feedback"
TRITON_FEEDBACK = "triton_mm.jsonl"  # in the feedback dataset folder: Triton sweep rows
ENV_VARS = ("CUTETUNE_MODE", "CUTETUNE_TOPK", "CUTETUNE_MODEL", "CUTETUNE_FEEDBACK",
            "CUTETUNE_FUSE_SWIGLU")

device_arch = launcher.device_arch  # module attribute so tests can stand in for a GPU


# ---------------------------------------------------------------- decisions (pure)
@dataclass(frozen=True)
class NodeDecision:
    """What one GEMM node gets: quack configs to offer, whether ATen is offered too, or
    ``leave``: cutetune cannot serve the node and Inductor's own candidates stand."""

    configs: tuple[KernelConfig, ...]
    aten: bool
    reason: str
    leave: bool = False
    # a host-bound and memory-bound GEMM: in reduced mode Inductor's Triton templates; in
    # predicted mode the one Triton mm config (Inductor's kwargs) the heuristics give it. Its
    # graph decides whether it takes them (CuteTuneChoices.graph_triton)
    triton: bool = False
    triton_config: tuple[tuple[str, int], ...] = ()


# Host time of one quack GEMM in a compiled step without CUDA graphs: the default step's host
# time per GEMM plus what each quack GEMM added to the same step timed beside it in one process,
# the larger of two H200 measurements: 25.2 + 15.8 us with two quack GEMMs of four at M=1
# (data/bench/step_ab_h200_predicted_attn_m1.json), 37.0 + 10.7 us at M=1024
# (data/bench/step_ab_h200_all_modes_m1024.json, where the quack kernels that Inductor's
# benchmark picked made the step 14 % slower). A GEMM that cannot take longer than this on the
# GPU gains nothing from a faster kernel where the step is host-bound, and loses the launch's
# extra host time. Those launches went through quack's Python path; launched from its TVM-FFI
# library a quack GEMM costs compiled code about what ATen's extern call does (-0.5 to +5.6
# us), 9-12 us more than a Triton template's (data/bench/launch_probe_h200*.json.gz). So below
# this size the choice stays the launch costs' one between templates and ATen: quack's GPU
# gain over cuBLAS there (at most 2.4 us on the probed shapes) cannot pay for a template's
# cheaper launch where the step waits on the host, and ATen matches its host cost.
QUACK_LAUNCH_HOST_US = 48.0


def host_bound(problem: GemmProblem, host_bound_us: float) -> tuple[float, bool] | None:
    """(time at the device's ceiling in us, whether memory-bound) when even that ceiling runs
    ``problem`` in under ``host_bound_us``; else None."""
    compute_s, memory_s = ceiling_times_s(problem, device_for(problem.arch))
    ideal_us = max(compute_s, memory_s) * 1e6
    return (ideal_us, memory_s >= compute_s) if ideal_us < host_bound_us else None


def _triton_config(heuristics, problem: GemmProblem, measured_only: bool = False
                   ) -> tuple[tuple[str, int], ...]:
    """The heuristics' Triton mm config for ``problem`` (with ``measured_only``, only one
    their retime measured), or () for ATen or no table."""
    lookup = getattr(heuristics, "triton_config", None)
    try:
        config = (None if lookup is None else
                  lookup(problem, measured_only=True) if measured_only else lookup(problem))
    except HeuristicsError:
        return ()
    return tuple(sorted(config.items())) if config else ()


def triton_candidates(problems, heuristics, host_bound_us: float
                      ) -> list[tuple[GemmProblem, dict[str, int]]]:
    """The problems (one per node of a graph) predicted mode would give a Triton config, each
    with it: what ``triton_problems`` weighs for the graph."""
    out = []
    for p in problems:
        config = decide(p, "predicted", heuristics, 1, host_bound_us).triton_config
        if config:
            out.append((p, dict(config)))
    return out


def triton_takers(graph: torch.fx.Graph, arch: str | None, heuristics) -> tuple[
        list[tuple[GemmProblem, dict[str, int]]], frozenset[GemmProblem] | None]:
    """A graph's ``triton_candidates`` and which of their problems take the Triton config,
    weighed together (the heuristics' ``triton_problems``; none where it raises, None where
    the heuristics cannot weigh)."""
    gemms = triton_candidates(graph_gemms(graph, arch), heuristics, host_bound_us())
    weigh = getattr(heuristics, "triton_problems", None)
    if weigh is None:
        return gemms, None
    try:
        return gemms, frozenset(weigh(gemms))
    except HeuristicsError:
        return gemms, frozenset()


def decide(problem: GemmProblem | ProblemError, mode: str, heuristics, top_k: int,
           host_bound_us: float = 0.0) -> NodeDecision:
    """predicted: the top-1 config alone, or ATen alone when the model prefers cuBLAS;
    reduced: the top-k configs and ATen. A node is left to Inductor (ATen alone under its
    default settings) when ``problem`` is the ProblemError saying why quack cannot run it, or
    when even the device's ceiling runs the GEMM in under ``host_bound_us``. Such a GEMM, if
    memory-bound, gets in predicted mode the heuristics' Triton config where they have one; in
    reduced mode the config their retime measured fastest for it where there is one (timed
    L2-cold beside the alternatives, which Inductor's benchmark, L2-warm and brief, cannot
    improve on), else Inductor's Triton templates benchmarked; either unless its graph keeps
    them on ATen (``CuteTuneChoices.graph_triton``)."""
    if isinstance(problem, ProblemError):
        return NodeDecision((), True, f"unsupported: {problem}", leave=True)
    bound = host_bound(problem, host_bound_us)
    if bound is not None:  # Inductor's own candidates: ATen, or under max-autotune also its
        # Triton templates, whose launches cost less host time than ATen's
        ideal_us, memory_bound = bound
        config = (_triton_config(heuristics, problem, measured_only=mode == "reduced")
                  if memory_bound else ())
        return NodeDecision((), True, f"host-bound: {ideal_us:.1f} us at the device's ceiling, "
                                      f"under a quack launch's {host_bound_us:.0f} us of host "
                                      f"time{'; memory-bound' if memory_bound else ''}",
                            leave=True,
                            triton=mode == "reduced" and memory_bound and not config,
                            triton_config=config)
    try:
        configs, prefers_aten = heuristics.lookup(problem)
    except HeuristicsError as e:
        return NodeDecision((), True, str(e), leave=True)
    # A stale file must not hand quack a config it rejects for this problem.
    configs = tuple(c for c in configs if is_valid(c, problem.arch, problem))
    if not configs:
        return NodeDecision((), True, "no valid config in the heuristics", leave=True)
    if mode == "predicted":
        if prefers_aten:
            return NodeDecision((), True, "the model prefers cuBLAS")
        return NodeDecision(configs[:1], False, "top-1")
    return NodeDecision(configs[:top_k], True, f"top-{top_k} + ATen")


def by_m_table(problem_at, heuristics, host_bound_us: float
               ) -> tuple[tuple[int, KernelConfig | None], ...]:
    """Predicted mode's pick for a GEMM whose M is known only at run time, per range of M
    (``launcher.m_ranges``): ``decide`` at each rung (``problem_at(m)``: the problem, or the
    ProblemError saying why quack cannot run it, at that M), ATen (None) wherever it does not
    give one quack config. Reduced mode uses this too: Inductor's benchmark would time one M
    (the size hint) for all of them."""

    def pick(m: int) -> KernelConfig | None:
        d = decide(problem_at(m), "predicted", heuristics, 1, host_bound_us)
        return d.configs[0] if len(d.configs) == 1 and not d.aten else None

    return launcher.m_ranges(pick)


def _node_problem(mat1, mat2, out_dtype: torch.dtype, arch: str | None,
                  m: int | None = None) -> GemmProblem:
    for node, name in ((mat1, "A"), (mat2, "B")):
        offset = launcher.static_ints([node.get_layout().offset], f"{name} offset")[0]
        if offset * node.get_dtype().itemsize % launcher.TMA_ALIGN_BYTES:
            raise ProblemError(f"{name} starts {offset} elements into its buffer (unaligned)")
    a_size = list(mat1.get_size())
    if m is not None:
        a_size[-2] = m
    return launcher.static_gemm_problem(a_size, mat1.get_stride(), mat2.get_size(),
                                        mat2.get_stride(), mat1.get_dtype(), out_dtype, arch)


def problem_from_inputs(op_name: str, kernel_inputs, arch: str | None,
                        m: int | None = None) -> GemmProblem:
    """The GemmProblem of an Inductor mm/addmm/bmm node (its MMKernelInputs), with its M set
    to ``m`` if given (a node whose M is dynamic), or ProblemError naming why quack cannot
    run it."""
    mat1, mat2 = kernel_inputs.mat1mat2()
    problem = _node_problem(mat1, mat2, kernel_inputs.out_dtype(), arch, m)
    if op_name == "addmm":
        inp = kernel_inputs.nodes()[0]
        launcher.addend_kind(launcher.static_ints(inp.get_size(), "input sizes"),
                             launcher.static_ints(inp.get_stride(), "input strides"),
                             inp.get_dtype(), kernel_inputs.out_dtype(), problem.m, problem.n,
                             kernel_inputs.get_scalar("beta"))
    return problem


# Nodes whose kernels the prefetcher builds: plain GEMMs. addmm's epilogue (bias or C) makes
# other kernels, which compile on first use as before.
PREFETCH_TARGETS = (torch.ops.aten.mm.default, torch.ops.aten.bmm.default)


def graph_gemms(graph: torch.fx.Graph, arch: str | None) -> list[GemmProblem]:
    """The GemmProblems of a graph's mm/bmm nodes that quack can run, one per node, read from
    their inputs' fake-tensor metadata (the layouts lowering will see, barring a layout
    Inductor changes)."""
    problems = []
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in PREFETCH_TARGETS:
            continue
        a, b = (getattr(x, "meta", {}).get("val") for x in node.args[:2])
        out = node.meta.get("val")
        if all(isinstance(t, torch.Tensor) for t in (a, b, out)):
            problems.append(operand_problem(a, b, out, arch))
    return [p for p in problems if p is not None]


def graph_problems(graph: torch.fx.Graph, arch: str | None) -> list[GemmProblem]:
    """The distinct ``graph_gemms`` (a kernel prefetched for a layout Inductor then changes
    goes unused)."""
    return list(dict.fromkeys(graph_gemms(graph, arch)))


# ---------------------------------------------------------------- the Inductor hook
# Heuristics sources by digest: the factory Inductor pickles (2.11) or asks uuid() of (2.13)
# must stay a few plain fields, so the loaded table is kept here.
_SOURCES: dict[str, object] = {}


class LastResortCaller(ExternKernelCaller):
    """ATen behind Triton templates that are benchmarked without it (reduced mode, a
    host-bound mm whose graph the heuristics give the templates): ranked last and never run
    in the benchmark, so Inductor takes it only where every template failed, instead of
    raising ``NoValidChoicesError`` (it does when all timings are inf). Its time is no
    measurement: feedback skips it, and its cache key is its own, so the autotune cache never
    hands the rank to a real ATen choice."""

    RANK_MS = 1e9  # finite: Inductor drops inf as failed

    @classmethod
    def behind(cls, aten: ExternKernelCaller) -> "LastResortCaller":
        caller = cls(aten.choice, aten.input_nodes, aten.layout, aten.kwargs,
                     has_out_variant=aten.has_out_variant)
        caller.annotations = getattr(aten, "annotations", {})
        caller.description = "ATen, taken only if every Triton template fails (not timed)"
        return caller

    def benchmark(self, *args, out) -> float:
        return self.RANK_MS

    def hash_key(self) -> str:
        return f"{super().hash_key()}-cutetune-last-resort"


class CuteTuneChoices(InductorChoices):
    """InductorChoices whose mm/addmm/bmm candidates are cutetune's (see the module doc)."""

    def __init__(self, mode: str, top_k: int, source: str) -> None:
        super().__init__()
        self.mode, self.top_k, self.source = mode, top_k, source
        self.heuristics = _SOURCES[source]
        self.externs = launcher.extern_choices()
        self._prefetched = weakref.WeakSet()  # graphs whose kernels went to the prefetcher
        self._graph_triton = weakref.WeakKeyDictionary()  # graph -> graph_triton()
        self._keep_only: dict[str, int] | None = None  # see _finalize_template_configs

    def uuid(self) -> str:
        return (f"cutetune-{cutetune.__version__}:{self.mode}:k{self.top_k}:{self.source}:"
                f"{decision_code_digest()}")

    def decide_node(self, kernel_inputs, op_name: str) -> tuple[GemmProblem | None, NodeDecision]:
        try:
            problem = problem_from_inputs(op_name, kernel_inputs,
                                          device_arch(kernel_inputs.device()))
        except ProblemError as e:
            return None, decide(e, self.mode, self.heuristics, self.top_k)
        return problem, decide(problem, self.mode, self.heuristics, self.top_k,
                               host_bound_us())

    def get_template_configs(self, kernel_inputs, templates, op_name, kwarg_overrides=None):
        """Answer each mm/addmm/bmm lowering's call: the call holding ATen's kernel gets this
        node's whole candidate list, calls holding only Triton/subgraph templates get none.
        Nodes cutetune cannot serve keep Inductor's candidates in every call."""
        args = (kernel_inputs, templates, op_name, kwarg_overrides)
        op = "mm" if op_name == "mm-ah" else op_name  # mm-ah: autoheuristic's extra Triton mms
        if (op not in PRIMARY_ATEN or kernel_inputs.device_type != "cuda"
                or not use_aten_gemm_kernels() or V.graph.cpp_wrapper):
            return super().get_template_configs(*args)
        problem, d = self.decide_node(kernel_inputs, op)
        takes_triton = None
        if d.triton or d.triton_config:
            takers = self.graph_triton(problem.arch)
            takes_triton = None if takers is None else problem in takers
            if takes_triton is False:
                d = replace(d, triton=False, triton_config=())  # ATen, Inductor's default
        if problem is None and op != "bmm":
            by_m = self.by_m_choices(kernel_inputs, templates, op)
            if by_m:
                return by_m
        if d.leave:
            if (d.triton or d.triton_config) and op_name == "mm":
                return self.host_bound_mm_configs(*args, only=dict(d.triton_config),
                                                  with_aten=takes_triton is None)
            return super().get_template_configs(*args)
        externs = [t for t in templates if isinstance(t, ExternKernelChoice)]
        if not externs:
            return []
        if not any(t.uid == PRIMARY_ATEN[op] for t in externs):  # e.g. mm with out_dtype
            return super().get_template_configs(*args)
        log.info("cutetune %s %s: %s%s", self.mode, op, d.reason,
                 "".join(f" {c.short()}" for c in d.configs))
        prefetching = self.mode == "reduced" and _prefetch_for is not None
        # the key each kernel the prefetcher can build is filed under (``prefetch.kernel_key``)
        keys = [kernel_key(problem, c) if op == "mm" or problem.batch > 1 else None
                for c in d.configs]
        if any(_needs_quack(op, problem.arch, key, prefetching) for key in keys):
            launcher.import_quack_in_background()  # the first launch needs it: import it now
        if prefetching:
            self.prefetch_graph(problem.arch)
        choices = []
        if d.aten:
            keep = externs if self.mode == "reduced" else [
                t for t in externs if t.uid == PRIMARY_ATEN[op]]
            choices += super().get_template_configs(kernel_inputs, keep, op_name,
                                                    kwarg_overrides)
        layout = kernel_inputs.output_layout(flexible=False)
        extra = {}
        if op == "addmm":
            extra = {"alpha": kernel_inputs.get_scalar("alpha"),
                     "beta": kernel_inputs.get_scalar("beta")}
        kernel = self.externs[launcher.ADDMM_KERNEL if op == "addmm" else launcher.MM_KERNEL]
        for c, key in zip(d.configs, keys):
            caller = kernel.bind(kernel_inputs.nodes(), layout,
                                 config=launcher.config_tuple(c), **extra)
            caller.description = c.short()
            if prefetching and key is not None:  # what the prefetcher builds
                caller.cutetune_kernel = (problem.arch, key)
            choices.append(caller)
        return choices

    def by_m_choices(self, kernel_inputs, templates, op: str) -> list:
        """A 2D mm/addmm whose M alone is dynamic (torch.compile's dynamic shapes, the
        default after a graph recompiles for a new batch or sequence length): one choice, not
        benchmarked, that runs ``by_m_table``'s config for the M of each call (quack serves
        every M with one compiled kernel). Empty where the table keeps every M on ATen, the
        node is not such a GEMM, or ATen's kernel is not among ``templates``."""
        mat1 = kernel_inputs.mat1mat2()[0]
        m = mat1.get_size()[-2] if len(mat1.get_size()) == 2 else None
        if (not isinstance(m, sympy.Expr) or m.is_Integer
                or not any(getattr(t, "uid", None) == PRIMARY_ATEN[op] for t in templates)):
            return []
        arch = device_arch(kernel_inputs.device())

        def problem_at(m: int) -> GemmProblem | ProblemError:
            try:
                return problem_from_inputs(op, kernel_inputs, arch, m)
            except ProblemError as e:
                return e

        table = by_m_table(problem_at, self.heuristics, host_bound_us())
        if all(c is None for _, c in table):
            return []
        described = ", ".join(f"M<={m_max}: {'ATen' if c is None else c.short()}"
                              for m_max, c in table[:-1])
        described += f"{', ' if described else ''}above: " + (
            "ATen" if table[-1][1] is None else table[-1][1].short())
        log.info("cutetune %s %s: dynamic M (%s): %s", self.mode, op, m, described)
        launcher.import_quack_in_background()
        extra = {}
        if op == "addmm":
            extra = {"alpha": kernel_inputs.get_scalar("alpha"),
                     "beta": kernel_inputs.get_scalar("beta")}
        kernel = self.externs[launcher.ADDMM_BY_M_KERNEL if op == "addmm"
                              else launcher.MM_BY_M_KERNEL]
        caller = kernel.bind(kernel_inputs.nodes(), kernel_inputs.output_layout(flexible=False),
                             table=tuple((m_max, None if c is None else launcher.config_tuple(c))
                                         for m_max, c in table), **extra)
        caller.description = f"by M: {described}"
        return [caller]

    def host_bound_mm_configs(self, kernel_inputs, templates, op_name, kwarg_overrides,
                              only: dict[str, int], with_aten: bool):
        """A host-bound and memory-bound plain mm. ``only`` empty (reduced mode, a shape the
        heuristics did not retime): Inductor's Triton mm template configs, benchmarked, with
        ATen beside them only ``with_aten`` (when the heuristics cannot weigh the graph: where
        they can and chose the templates, a benchmark of GPU time alone would often pick ATen,
        which the step cannot afford; ATen then stays behind them as a ``LastResortCaller``).
        Otherwise (predicted mode, and reduced mode for a
        retimed shape): the one Triton config whose kwargs match ``only``, alone, so it is not
        benchmarked. Either way the configs come from max-autotune's list with its fixed
        layouts (``max_autotune_gemm`` holds while they are generated; a config asked for that
        is not in its default list is looked for in its exhaustive one), and where Inductor
        offers none of them ATen stands alone. Under max-autotune, or where Inductor's Triton
        templates do not apply (dtype, a small GPU), Inductor's own list stands."""
        from torch._inductor.kernel.mm import mm_template
        from torch._inductor.utils import use_triton_template

        args = (kernel_inputs, templates, op_name, kwarg_overrides)
        if (not any(getattr(t, "uid", None) == PRIMARY_ATEN["mm"] for t in templates)
                or not all(isinstance(t, ExternKernelChoice) for t in templates)
                or not use_triton_template(kernel_inputs.output_layout(),
                                           check_max_autotune=False)):
            return super().get_template_configs(*args)
        offered = [*templates, mm_template] if with_aten and not only else [mm_template]
        self._keep_only = only or None
        choices = []
        try:
            # a config from the exhaustive space (scripts/triton_mm_sweep.py --search-space)
            # is generated only there; look for it in the default list first, which is shorter
            for space in ("DEFAULT", "EXHAUSTIVE") if only else ("DEFAULT",):
                with inductor_config.patch(max_autotune_gemm=True,
                                           max_autotune_gemm_search_space=space):
                    choices = super().get_template_configs(kernel_inputs, offered, op_name,
                                                           kwarg_overrides)
                if choices:
                    break
        finally:
            self._keep_only = None
        if not choices:
            log.info("cutetune %s mm: Inductor offers no Triton config %s here; ATen",
                     self.mode, only or "")
            return super().get_template_configs(*args)
        log.info("cutetune %s mm: host-bound, %s", self.mode,
                 f"Triton config {only}" if only else
                 f"Triton templates{' and ATen' if with_aten else ''} benchmarked")
        if only or with_aten:
            return choices
        return choices + [LastResortCaller.behind(c) for c in super().get_template_configs(*args)
                          if isinstance(c, ExternKernelCaller)]

    def _finalize_template_configs(self, template_choices, kernel_inputs, templates, op_name,
                                   kwarg_overrides=None):
        """Inductor's hook between its config generators and the (costly) choice generation:
        while ``host_bound_mm_configs`` asks for one Triton config, keep only that one."""
        choices = super()._finalize_template_configs(template_choices, kernel_inputs, templates,
                                                     op_name, kwarg_overrides)
        only = self._keep_only
        if not only:
            return choices
        for ktc in choices:
            kwargs = ktc.params.to_kwargs()
            if all(kwargs.get(k) == v for k, v in only.items()):
                return [ktc]
        return []

    def graph_triton(self, arch: str) -> frozenset[GemmProblem] | None:
        """Once per graph: which problems of its mm that predicted mode would give a Triton
        config take it, all weighed together (the heuristics' ``triton_problems``: a Triton
        launch saves host time but costs GPU time, which only a host-bound step can spare).
        Reduced mode takes the config of those the retime measured, like predicted mode, and
        benchmarks Inductor's Triton list for the rest of them, without ATen: its benchmark
        times the GPU alone. None where the heuristics source cannot answer (no
        ``triton_problems``): predicted mode then takes its configs and reduced mode
        benchmarks Inductor's Triton list beside ATen."""
        graph = V.graph
        if graph not in self._graph_triton:
            gemms, takers = triton_takers(graph.module.graph, arch, self.heuristics)
            self._graph_triton[graph] = takers
            log.info("cutetune %s: %d mm of this graph have Triton configs; %s", self.mode,
                     len(gemms), "not weighed" if takers is None else
                     f"{sum(p in takers for p, _ in gemms)} take them")
        return self._graph_triton[graph]

    def prefetch_graph(self, arch: str) -> None:
        """Once per graph: send the top-k kernels of all its mm/bmm nodes to the prefetcher.
        A failure here costs compile time only, never the compile."""
        graph = V.graph
        if graph in self._prefetched:
            return
        self._prefetched.add(graph)
        try:
            n = send_kernels(graph_problems(graph.module.graph, arch), arch, self.mode,
                             self.heuristics, self.top_k)
            log.info("cutetune: %d kernels of this graph sent to the compile workers", n)
        except Exception as e:  # noqa: BLE001
            log.warning("cutetune: kernel prefetch failed (%s: %s); kernels compile on first use",
                        type(e).__name__, e)


def send_kernels(problems, arch: str, mode: str, heuristics, top_k: int) -> int:
    """Hand the active prefetcher the top-k kernels of ``problems`` (of one arch); how many it
    had not been sent before."""
    kernels = [(p, c) for p in problems
               for c in decide(p, mode, heuristics, top_k, host_bound_us()).configs]
    return _prefetch_for(arch).submit(kernels)


def early_prefetch_pass(factory: ChoicesFactory, user_pass) -> EarlyPrefetchPass:
    """The pre-grad pass that sends a graph's kernels from Dynamo's graph
    (``early_prefetch.py``), seconds before its first GEMM node is lowered."""
    heuristics = _SOURCES[factory.source]

    def send(problems: list[GemmProblem]) -> None:
        if _prefetch_for is None:  # compiled after the installation ended
            return
        for arch in dict.fromkeys(p.arch for p in problems):
            n = send_kernels([p for p in problems if p.arch == arch], arch, factory.mode,
                             heuristics, factory.top_k)
            log.info("cutetune: %d kernels of this graph sent to the compile workers from "
                     "Dynamo's graph", n)

    return EarlyPrefetchPass(send, f"{factory.mode}:k{factory.top_k}:{factory.source}:"
                             f"{factory.code}", lambda device: device_arch(device), user_pass)


def host_bound_us() -> float:
    """``decide``'s host-bound limit for the graph being compiled: none under CUDA graphs
    (mode="reduce-overhead"), whose replay launches no kernel from the host."""
    return 0.0 if inductor_config.triton.cudagraphs else QUACK_LAUNCH_HOST_US


# The modules whose code decides what a node's generated code calls.
DECISION_MODULES = ("cutetune.tuner.inductor", "cutetune.tuner.launcher",
                    "cutetune.tuner.swiglu", "cutetune.tuner.fusion_pass",
                    "cutetune.tuner.graph_pass", "cutetune.tuner.heuristics",
                    "cutetune.models.triton_mm",
                    "cutetune.space.features", "cutetune.space.rules", "cutetune.space.config",
                    "cutetune.space.problem", "cutetune.space.device")


@lru_cache(maxsize=None)
def decision_code_digest() -> str:
    """A digest of the decision modules' source, part of the FX-graph cache key: a graph
    compiled by other cutetune code (an edited checkout, another release of the same version
    string) is compiled again rather than reloaded with that code's choices."""
    h = hashlib.sha256()
    for name in DECISION_MODULES:
        h.update(Path(sys.modules[name].__file__).read_bytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class ChoicesFactory:
    """What ``inductor_choices_class`` holds: plain fields, so torch 2.11 can pickle it into
    the cache key, and a call that builds the choices (2.13 asks their ``uuid()``)."""

    mode: str
    top_k: int
    source: str
    code: str = field(default_factory=decision_code_digest)

    def __call__(self) -> CuteTuneChoices:
        if self.source not in _SOURCES:
            raise RuntimeError(f"cutetune heuristics {self.source} are not loaded in this "
                               "process: call cutetune.tuner.inductor.enable() first")
        return CuteTuneChoices(self.mode, self.top_k, self.source)


def decide_swiglu(problem: GemmProblem, heuristics, host_bound_us: float,
                  dynamic_m: bool = False) -> KernelConfig | None:
    """The config to fuse SwiGLU's pointwise product into ``problem`` (its up projection)
    with, or None: ``swiglu.fusion_config``, except where the GEMM is host-bound. There, in a
    static graph, only where the GPU measured the fusion (the heuristics' SwiGLU table), and
    the fusion pass leaves it unfused where the graph's weighing gives its problem a Triton
    template (``triton_takers``; ``SwigluFusionPass`` says why): the
    unfused step is two GEMMs and Inductor's pointwise kernel, and whether one fused launch
    beats them depends on the kernel more than on the traffic it saves. For a rung of a graph
    whose M is dynamic (``dynamic_m``) the unfused alternative is the by-M op's own path, a
    GEMM and a pointwise launch of its own instead of Inductor's fused pointwise kernel: there
    a host-bound rung fuses with the heuristics' config, whatever the saved traffic (at M=16
    unfused, the dynamic MLP stepped 1.21x the default's:
    data/bench/step_dynamic_h200_extern.json)."""
    try:
        if host_bound(problem, host_bound_us) is None:
            return swiglu.fusion_config(problem, heuristics)
        return swiglu.fusion_config(problem, heuristics,
                                    min_share=0.0 if dynamic_m else math.inf)
    except HeuristicsError:
        return None


def swiglu_fusion_pass(factory: ChoicesFactory, user_pass) -> SwigluFusionPass:
    """The post-grad pass that fuses SwiGLU (``swiglu.py``) as ``decide_swiglu`` says."""
    heuristics = _SOURCES[factory.source]
    key = f"{factory.mode}:{factory.source}:{factory.code}"
    return SwigluFusionPass(lambda p: decide_swiglu(p, heuristics, host_bound_us()), key,
                            lambda device: device_arch(device), user_pass, prepare_fused_kernel,
                            lambda p: decide_swiglu(p, heuristics, host_bound_us(), True),
                            lambda graph, arch: triton_takers(graph, arch, heuristics)[1] or ())


def prepare_fused_kernel(problem: GemmProblem, config: KernelConfig) -> None:
    """Get a fused SwiGLU kernel ready while Inductor compiles: unless its TVM-FFI library is
    built or linked from prebuilt kernel objects (``aot.ensure_library``), the compile helper
    builds it (``swiglu.build_library``; started now in predicted mode), and calls run ATen,
    unfused, until it is built, then launch it without importing quack (in later processes
    too). Nothing waits: on the H200 host the helper's library came 4.1-5.8 s after the
    compile even forked (data/bench/e2e_h200_1gpu_fork_predicted.json), about what compiling
    through quack in the process cost the compile, 3.7-6.2 s
    (data/bench/e2e_h200_1gpu_aot*.json). Without a C
    compiler to link with, or with quack's disk cache off, the first launch compiles through
    quack here. No import runs in a thread meanwhile: on the H200 host quack's import holds
    the GIL throughout and a thread hid none of it (data/bench/import_probe_h200.json)."""
    key = swiglu.library_key(config, problem.arch, launcher.TORCH_DTYPE_OF[problem.dtype],
                             (problem.a_major, problem.b_major))
    if aot.ensure_library(key):
        return
    helper = shared_prefetcher(problem.arch)
    if helper.enabled and aot.can_link():
        key = helper.submit_swiglu(problem, config)
        swiglu.building(key, lambda: helper.build_state(key))


# ---------------------------------------------------------------- feedback
class FeedbackRecorder:
    """An Inductor feedback saver appending the timings of the nodes cutetune served to a
    dataset: quack rows with their config, ATen rows as backend "cublas"; and of the
    host-bound mm it had Inductor benchmark Triton templates for, a Triton sweep row in the
    dataset folder's TRITON_FEEDBACK file (``triton_timings``), for ``cutetune emit
    --triton-sweep``. Timings the autotune cache replays unchanged are not appended twice."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.run_id = uuidlib.uuid4().hex[:12]
        self._seen: set[tuple] | None = None
        self._triton_seen: set[tuple] | None = None
        self._env: dict | None = None

    def _load_seen(self) -> set[tuple]:
        from cutetune.dataset import load, parts

        if not parts(self.path):
            return set()
        t = load(self.path, columns=["suite", "problem_key", "backend", "config_key", "time_ms"])
        return {(pk, b, ck, tm) for s, pk, b, ck, tm in zip(*(t.column(c).to_pylist() for c in (
            "suite", "problem_key", "backend", "config_key", "time_ms"))) if s == FEEDBACK_SUITE}

    @staticmethod
    def _triton_key(row: dict) -> tuple:
        return (row["m"], row["n"], row["k"], row["majors"],
                tuple((c["name"], c["ms"]) for c in row["choices"]))

    def _load_triton_seen(self) -> set[tuple]:
        """The keys of the Triton rows already in the file (earlier processes' replays too); a
        line that does not parse is left for ``load_sweep`` to name, not fed back again."""
        seen = set()
        path = self.path / TRITON_FEEDBACK
        for line in path.read_text().splitlines() if path.exists() else ():
            try:
                seen.add(self._triton_key(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
        return seen

    def _problem(self, input_nodes) -> GemmProblem | None:
        """The benchmarked node's GemmProblem (None where quack could not run it), with this
        recorder's environment read on first use."""
        mat1, mat2 = input_nodes[-2:]
        try:
            problem = _node_problem(mat1, mat2, mat1.get_dtype(), device_arch(mat1.get_device()))
        except ProblemError:
            return None
        if self._env is None:
            self._env = environment()
        return problem

    def rows(self, timings, name, input_nodes) -> list[dict]:
        served = [c for c in timings if isinstance(c, ExternKernelCaller)
                  and c.choice.name in (launcher.MM_KERNEL, launcher.ADDMM_KERNEL)]
        if name not in PRIMARY_ATEN or not served:
            return []
        problem = self._problem(input_nodes)
        if problem is None:
            return []
        base = {**self._env, **problem.to_dict(), "run_id": self.run_id,
                "timestamp": time.time(), "problem_key": problem.key(), "suite": FEEDBACK_SUITE}
        rows = []
        for choice, ms in timings.items():
            if not isinstance(choice, ExternKernelCaller):
                continue
            if choice in served:
                cfg = launcher.as_config(choice.kwargs["config"])
                row = {**base, "backend": "quack", "config_key": cfg.short(), **cfg.to_dict()}
            elif choice.choice.name in ATEN_KERNELS:
                row = {**base, "backend": "cublas", "config_key": ""}  # as the harness
            else:
                continue
            ok = math.isfinite(ms)
            row.update(status="ok" if ok else "runtime_error", time_ms=ms if ok else None,
                       error=None if ok else "Inductor benchmark returned inf")
            rows.append(row)
        return rows

    def triton_row(self, timings, name, input_nodes) -> dict | None:
        """The Triton sweep row of a plain mm whose benchmark held Triton templates, or None."""
        from torch._inductor.select_algorithm import TritonTemplateCaller

        if name != "mm" or not any(isinstance(c, TritonTemplateCaller) for c in timings):
            return None
        problem = self._problem(input_nodes)
        if problem is None:
            return None
        return sweep_row(problem, timings, self._env["device_name"], self._env["torch_version"],
                         suite=FEEDBACK_SUITE, run_id=self.run_id, timestamp=time.time())

    def __call__(self, timings, name, input_nodes, choices, profiler_bench_function,
                 precompile_times=None) -> None:
        """Inductor's FeedbackFunction signature (the same in torch 2.11 and 2.13)."""
        from cutetune.dataset import append

        timings = {c: ms for c, ms in timings.items() if not isinstance(c, LastResortCaller)}
        triton = self.triton_row(timings, name, input_nodes)
        if triton is not None:
            if self._triton_seen is None:
                self._triton_seen = self._load_triton_seen()
            key = self._triton_key(triton)
            if key not in self._triton_seen:
                self._triton_seen.add(key)
                append_row(self.path / TRITON_FEEDBACK, triton)
        rows = self.rows(timings, name, input_nodes)
        if not rows:
            return
        if self._seen is None:
            self._seen = self._load_seen()
        fresh = []
        for r in rows:
            key = (r["problem_key"], r["backend"], r["config_key"], r["time_ms"])
            if key not in self._seen:
                self._seen.add(key)
                fresh.append(r)
        append(self.path, fresh)


# ---------------------------------------------------------------- installation
_UNSET = object()
_HANDLER_KEY = virtualized._choices._key
# The active installation's prefetcher source in reduced mode: arch -> object with
# submit(kernels). Compile workers are a process-wide resource, so one prefetcher per arch.
_prefetch_for = None


# How long a node's benchmark waits for the compile workers before compiling here instead:
# the helper's start (its imports) plus a few rounds of compiles, the slowest of all 1200 sm90
# kernels taking 6.2 s on the H200 host (data/reports/gpu/warm_space_check_h200x2.json.gz).
PREFETCH_WAIT_S = 60.0


def _needs_quack(op: str, arch: str, key: tuple | None, prefetching: bool) -> bool:
    """Whether a node's kernel (filed under ``key``, ``prefetch.kernel_key``) will launch
    through quack, which this process must then import, rather than from its TVM-FFI library:
    built already, or to be built by a prefetcher that is on."""
    if op != "mm":
        return True
    building = prefetching and getattr(_prefetch_for(arch), "enabled", True)
    return not (is_library(key) and (building or aot.library_ready(key[1])))


def await_prefetched(choices: list) -> list:
    """Inductor preprocessing hook (reduced mode), run on each node's choices just before they
    are benchmarked: import quack here if a kernel launches through it (meanwhile the workers
    compile), then wait for the node's kernels that the workers are still building and that
    are not built already, rather than build them one by one in this process (the wait is
    logged). Choices pass through unchanged."""
    kernels = [k for k in (getattr(c, "cutetune_kernel", None) for c in choices) if k]
    if kernels and _prefetch_for is not None:
        keys = [key for _, key in kernels]
        try:
            if not all(is_library(k) for k in keys):
                launcher.import_quack()
            t0 = time.perf_counter()
            ready = _prefetch_for(kernels[0][0]).wait_for(keys, timeout=PREFETCH_WAIT_S)
            log.info("cutetune: waited %.2f s for the compile helper's %d kernels of a node%s",
                     time.perf_counter() - t0, len(keys), "" if ready else " (timed out)")
        except Exception as e:  # noqa: BLE001  (the benchmark compiles what is missing)
            log.warning("cutetune: waiting for prefetched kernels failed (%s: %s)",
                        type(e).__name__, e)
    return choices


def _swap_thread_handler(value):
    """Set (or with _UNSET clear) this thread's cached V.choices; return the previous one.
    Inductor builds it from ``inductor_choices_class`` on first use and then keeps it, so
    changing the config alone would not reach a thread that has compiled before."""
    prev = getattr(virtualized.threadlocal, _HANDLER_KEY, _UNSET)
    if value is _UNSET:
        if prev is not _UNSET:
            delattr(virtualized.threadlocal, _HANDLER_KEY)
    else:
        setattr(virtualized.threadlocal, _HANDLER_KEY, value)
    return prev


def _resolve_source(model) -> str:
    """Register the heuristics behind ``model`` and return their digest."""
    if model is None:
        h = PackagedHeuristics()
    elif isinstance(model, (str, os.PathLike)):
        h = Heuristics.load(model)
    elif hasattr(model, "lookup"):
        h = model
    elif hasattr(model, "rank") and hasattr(model, "prefers_cublas"):
        h = ModelHeuristics(model)
    else:
        raise TypeError(f"model must be a heuristics file path, an object with lookup(problem), "
                        f"or a cost model with rank() and prefers_cublas(); got {type(model)}")
    digest = getattr(h, "digest", None) or f"{type(h).__qualname__}@{id(h):x}"
    _SOURCES[digest] = h
    return digest


def _chain_pass(slot: str, kind: type, make) -> object:
    """Set Inductor's custom-pass ``slot`` to ``make(user_pass)`` (None: to the user's pass
    alone), where the user's pass is what the slot holds without an outer installation's pass
    of this ``kind``; the slot's previous value, for ``disable``."""
    prev = getattr(inductor_config, slot)
    user_pass = prev.user_pass if isinstance(prev, kind) else prev
    setattr(inductor_config, slot, make(user_pass) if make is not None else user_pass)
    return prev


class Installation:
    """An active ``enable()``: a context manager, or call ``disable()``. Restores the previous
    ``inductor_choices_class``, this thread's choices handler, the feedback savers, the
    prefetcher source, the pre-grad pass that feeds it, the preprocessing hook that waits for
    it, Triton's cache manager and the post-grad pass that fuses SwiGLU."""

    def __init__(self, factory: ChoicesFactory | None, feedback: FeedbackRecorder | None,
                 prefetch_for=None, fuse_swiglu: bool = False) -> None:
        global _prefetch_for
        self.factory, self.feedback = factory, feedback
        self._prev_post_pass = _chain_pass(
            "post_grad_custom_post_pass", SwigluFusionPass,
            (lambda user: swiglu_fusion_pass(factory, user))
            if factory is not None and fuse_swiglu else None)
        self._prev_pre_pass = _chain_pass(
            "pre_grad_custom_pass", EarlyPrefetchPass,
            (lambda user: early_prefetch_pass(factory, user))
            if factory is not None and prefetch_for is not None else None)
        self._prev_manager = template_cache.install() if factory is not None else _UNSET
        self._prev_prefetch, _prefetch_for = _prefetch_for, prefetch_for
        self._prev_class = inductor_config.inductor_choices_class
        if factory is not None:
            new_class = factory
        elif isinstance(self._prev_class, ChoicesFactory):
            new_class = None  # "off" lifts an outer cutetune installation
        else:
            new_class = self._prev_class
        inductor_config.inductor_choices_class = new_class
        self._prev_handler = _swap_thread_handler(_UNSET)
        if feedback is not None:
            get_algorithm_selector_cache().add_feedback_saver(feedback)
        self.waits_for_prefetch = prefetch_for is not None
        if self.waits_for_prefetch:
            get_algorithm_selector_cache().add_preprocessing_fn(await_prefetched)
        self.active = True

    def disable(self) -> None:
        global _prefetch_for
        if not self.active:
            return
        self.active = False
        _prefetch_for = self._prev_prefetch
        if self._prev_manager is not _UNSET:
            template_cache.uninstall(self._prev_manager)
        inductor_config.inductor_choices_class = self._prev_class
        inductor_config.post_grad_custom_post_pass = self._prev_post_pass
        inductor_config.pre_grad_custom_pass = self._prev_pre_pass
        _swap_thread_handler(self._prev_handler)
        cache = get_algorithm_selector_cache()
        if self.feedback is not None and self.feedback in cache.feedback_saver_fns:
            cache.feedback_saver_fns.remove(self.feedback)
        if self.waits_for_prefetch and await_prefetched in cache.preprocessing_fns:
            cache.preprocessing_fns.remove(await_prefetched)

    def __enter__(self) -> "Installation":
        return self

    def __exit__(self, *exc) -> None:
        self.disable()


def enable(mode: str = "predicted", top_k: int | None = None, model=None,
           feedback: str | os.PathLike | None = None, prefetch=True,
           fuse_swiglu: bool = True) -> Installation:
    """Install cutetune's choices into Inductor; use as a function or a context manager.

    ``model``: a heuristics file (``cutetune emit``), an object with ``lookup(problem)``, or a
    cost model with ``rank``/``prefers_cublas``; default: the heuristics packaged with
    cutetune. ``top_k``: reduced-mode candidates (default REDUCED_TOP_K). ``feedback``: a
    dataset folder that receives Inductor's reduced-mode timings. ``prefetch`` (reduced mode):
    compile each graph's candidate kernels in parallel worker processes, started now so they
    load while Dynamo traces (``cutetune.enable`` starts them before Inductor's import) and
    sent the kernels from Dynamo's graph (True), not at all (False), or a callable ``arch ->
    object with submit(kernels)``. Both modes keep the Triton template kernels they lead Inductor to
    compile in cutetune's kernel cache (``tuner/template_cache.py``), and with ``fuse_swiglu``
    run ``silu(g) * mm(x, w)`` as one quack GEMM where ``decide_swiglu`` says (``swiglu.py``).
    """
    if mode not in MODES:
        raise ValueError(f"unknown cutetune mode {mode!r}; expected one of {', '.join(MODES)}")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
    if mode == "predicted" and top_k not in (None, 1):
        raise ValueError("predicted mode offers one config per node; top_k is for reduced mode")
    if feedback is not None and mode != "reduced":
        raise ValueError("feedback records Inductor's benchmarks, which only reduced mode runs")
    if mode == "off":
        return Installation(None, None)
    k = 1 if mode == "predicted" else (top_k or REDUCED_TOP_K)
    launcher.extern_choices()  # generated code (also from the FX cache) calls these by name
    factory = ChoicesFactory(mode, k, _resolve_source(model))
    prefetch_for = None
    if mode == "reduced" and prefetch:
        # predicted mode does not prefetch plain GEMMs (one kernel per served node compiles in
        # less time than the helper takes to start), and starts the helper only when a fused
        # SwiGLU kernel needs building (``prepare_fused_kernel``)
        prefetch_for = shared_prefetcher if prefetch is True else prefetch
        if prefetch is True:  # started now (if ``cutetune.enable`` has not), it imports
            start_for_this_gpu()  # quack while Dynamo traces
    return Installation(factory, FeedbackRecorder(feedback) if feedback is not None else None,
                        prefetch_for, fuse_swiglu)


def enable_from_env(environ=None) -> Installation | None:
    """``enable()`` configured by CUTETUNE_MODE (predicted | reduced | off; unset = off),
    CUTETUNE_TOPK, CUTETUNE_MODEL (heuristics file), CUTETUNE_FEEDBACK (dataset folder) and
    CUTETUNE_FUSE_SWIGLU (1, the default, or 0). Returns None when the mode is off."""
    env = os.environ if environ is None else environ
    mode = env.get("CUTETUNE_MODE", "").strip().lower() or "off"
    if mode not in MODES:
        raise ValueError(f"CUTETUNE_MODE={env['CUTETUNE_MODE']!r}; expected one of "
                         f"{', '.join(MODES)}")
    top_k = None
    if env.get("CUTETUNE_TOPK", "").strip():
        try:
            top_k = int(env["CUTETUNE_TOPK"])
        except ValueError:
            raise ValueError(f"CUTETUNE_TOPK={env['CUTETUNE_TOPK']!r} is not an integer") from None
    fuse = env.get("CUTETUNE_FUSE_SWIGLU", "").strip() or "1"
    if fuse not in ("0", "1"):
        raise ValueError(f"CUTETUNE_FUSE_SWIGLU={env['CUTETUNE_FUSE_SWIGLU']!r}; expected 0 or 1")
    if mode == "off":
        return None
    return enable(mode, top_k=top_k, model=env.get("CUTETUNE_MODEL") or None,
                  feedback=env.get("CUTETUNE_FEEDBACK") or None, fuse_swiglu=fuse == "1")
