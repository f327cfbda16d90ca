"""The Inductor hook: an ``InductorChoices`` whose mm/addmm/bmm candidates are cutetune's
(``decisions.py`` decides, this module turns a decision into Inductor's choices)."""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field, replace

import sympy
from torch._inductor import config as inductor_config
from torch._inductor.choices import InductorChoices
from torch._inductor.select_algorithm import (
    ExternKernelCaller,
    ExternKernelChoice,
)
from torch._inductor.utils import use_aten_gemm_kernels
from torch._inductor.virtualized import V

from ...version import __version__
from ...space.problem import GemmProblem, ProblemError
from ..kernels import aot, launcher, problems, quack_gemm
from ..kernels.helper import is_library, kernel_key
from ..kernels.problems import config_tuple, graph_problems, problem_from_inputs
from .cache_key import decision_code_digest
from .decisions import (NodeDecision, by_m_table, decide, host_bound_us, triton_takers,
                        under_cuda_graphs)

log = logging.getLogger(__name__)


# op name -> uid of ATen's own kernel for it: the template whose get_template_configs call we
# answer. Other ATen variants (mm with out_dtype, bias_addmm) are left to Inductor.
PRIMARY_ATEN = {"mm": "aten::mm", "addmm": "aten::addmm", "bmm": "aten::bmm"}


# ---------------------------------------------------------------- the Inductor hook
# Heuristics sources by digest: the factory Inductor pickles (2.11) or asks uuid() of (2.13)
# must stay a few plain fields, so the loaded table is kept here.
_SOURCES: dict[str, object] = {}
# The active installation's prefetcher source in reduced mode (``install.py`` sets it): arch ->
# object with submit(kernels). Compile workers are a process-wide resource: one per arch.
_prefetch_for = None


def _needs_quack(op: str, arch: str, key: tuple | None, prefetching: bool) -> bool:
    """Whether a node's kernel (filed under ``key``, ``prefetch.kernel_key``) will launch
    through quack, which this process must then import, rather than from its TVM-FFI library:
    built already, or to be built by a prefetcher that is on."""
    if op != "mm":
        return True
    building = prefetching and getattr(_prefetch_for(arch), "enabled", True)
    return not (is_library(key) and (building or aot.library_ready(key[1])))


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
        # a capture in progress decides as CUDA graphs do, which Inductor's config does not
        # say; torch 2.11 asks the passes' uuids alone (``ChainedPass.uuid`` says it too), and
        # a user's pass may take the post-grad slot from cutetune's
        return (f"cutetune-{__version__}:{self.mode}:k{self.top_k}:{self.source}:"
                f"{decision_code_digest()}{':graphs' if under_cuda_graphs() else ''}")

    def decide_node(self, kernel_inputs, op_name: str) -> tuple[GemmProblem | None, NodeDecision]:
        try:
            problem = problem_from_inputs(op_name, kernel_inputs,
                                          problems.device_arch(kernel_inputs.device()))
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
            quack_gemm.import_quack_in_background()  # the first launch needs it: import it now
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
                                 config=config_tuple(c), **extra)
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
        arch = problems.device_arch(kernel_inputs.device())

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
        quack_gemm.import_quack_in_background()
        extra = {}
        if op == "addmm":
            extra = {"alpha": kernel_inputs.get_scalar("alpha"),
                     "beta": kernel_inputs.get_scalar("beta")}
        kernel = self.externs[launcher.ADDMM_BY_M_KERNEL if op == "addmm"
                              else launcher.MM_BY_M_KERNEL]
        caller = kernel.bind(kernel_inputs.nodes(), kernel_inputs.output_layout(flexible=False),
                             table=tuple((m_max, None if c is None else config_tuple(c))
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
            if takers is None:
                log.info("cutetune %s: this graph's Triton configs are not weighed", self.mode)
            else:
                log.info("cutetune %s: %d mm of this graph have Triton configs; %d take them",
                         self.mode, len(gemms), sum(p in takers for p, _ in gemms))
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
