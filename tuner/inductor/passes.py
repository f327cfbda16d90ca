"""cutetune's Inductor graph passes. Each takes one custom-pass slot of Inductor's config and
runs the user's own pass of that slot first (``ChainedPass``):

- ``EarlyPrefetchPass`` (pre-grad): Reduced mode's kernels sent to the compile helper from Dynamo's graph, before AOTAutograd.
  
  The prefetcher (``tuner/kernels/helper.py``) gets a graph's top-k kernels when Inductor lowers its first
  GEMM node, after AOTAutograd has traced, decomposed and partitioned the graph: seconds into a
  fresh process's first compile, which its benchmark then waits out for the helper's compiles.
  Dynamo's graph already holds the GEMMs (``linear``, ``matmul``, ``mm``, ``bmm`` calls with
  fake-tensor values), so a pre-grad pass can read their problems as Inductor will see them
  and send the kernels then. What it reads wrong (a layout lowering changes) costs a kernel
  built for nothing; what it misses is sent at lowering as before.

- ``GemvPass`` (post-grad): under CUDA graphs, a one-row mm becomes the multiply and sum of
  a GEMV, which Inductor fuses with its neighbours (see the class).

- ``SwigluFusionPass`` (post-grad): The Inductor post-grad pass that rewrites ``silu(g) * mm(x, w)`` into cutetune's fused
  SwiGLU GEMM (``cutetune::mm_silu_mul``, ``swiglu.py``) where the decision says so.
  
  Installed through ``torch._inductor.config.post_grad_custom_post_pass`` (no patching of
  torch): it runs on the post-grad graph, where silu is already decomposed, so the pattern is
  traced from ``F.silu(g) * torch.mm(x, w)`` by Inductor's own decompositions (whatever this
  torch makes of silu) rather than written by hand. A pass the user installed there still runs,
  before this one. Its ``uuid()`` (mode, heuristics, decision code) is part of Inductor's
  FX-graph cache key.
"""

from __future__ import annotations

import logging
import pickle
import time
from functools import lru_cache
from typing import Callable, Collection

import torch
import torch.nn.functional as F
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass

from ...space.config import KernelConfig
from ...space.problem import GemmProblem, ProblemError
from ..kernels import grouped_mm, launcher, swiglu
from ..kernels.problems import (config_ints, dynamo_gemms, fx_problem, grouped_problem,
                               static_ints, table_ints)
from .decisions import under_cuda_graphs

log = logging.getLogger(__name__)


class ChainedPass(CustomGraphPass):
    """``apply(graph)`` after ``user_pass`` (the slot's previous pass, if any: a
    CustomGraphPass or a plain function); ``key`` says what decides, and goes with the user's
    pass into ``uuid()``, so into Inductor's cache key."""

    NAME = "cutetune"

    def __init__(self, key: str, user_pass: Callable[[torch.fx.Graph], None] | None = None
                 ) -> None:
        self.key, self.user_pass = key, user_pass

    def uuid(self) -> str | None:
        """None where the user's pass has no uuid (a plain function, say): Inductor then
        bypasses its caches, as it would for that pass alone. A graph compiled under CUDA
        graphs is decided by GPU time alone (``under_cuda_graphs``), and a capture in progress
        is in no config Inductor keys on: the tag keeps its FX-cache entry apart (every torch
        asks the passes' uuids; only 2.13 asks the choices', which carry it too)."""
        key = f"{self.NAME}:{self.key}{':graphs' if under_cuda_graphs() else ''}"
        if self.user_pass is None:
            return f"{key}:None"
        user = self.user_pass.uuid() if isinstance(self.user_pass, CustomGraphPass) else None
        return f"{key}:{user!r}" if user else None

    def __reduce__(self):
        """What pickling makes of the pass: its uuid. torch 2.11's FX-graph cache key pickles
        the pre-grad slot with the rest of Inductor's config (later releases ask its uuid), and
        a pass holding closures failed there, so every graph compiled with it bypassed the
        cache (seen on the H200 host with the early-prefetch pass). With no uuid it does not
        pickle, which bypasses the cache as the uuid's absence does elsewhere."""
        uuid = self.uuid()
        if uuid is None:
            raise pickle.PicklingError(f"{type(self).__name__} has no uuid: its user pass "
                                       "has none")
        return str, (uuid,)

    def __deepcopy__(self, memo) -> "ChainedPass":
        """The pass itself: Inductor deep-copies its config (to restore it later, say), and
        a copy must stay a pass, not the str that pickling makes of it."""
        return self

    def __copy__(self) -> "ChainedPass":
        return self

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self.user_pass is not None:
            self.user_pass(graph)
        self.apply(graph)

    def apply(self, graph: torch.fx.Graph) -> None:
        raise NotImplementedError


class EarlyPrefetchPass(ChainedPass):
    """A pre-grad pass that hands ``send`` the problems of ``dynamo_gemms`` and leaves the
    graph as it is. A failure is logged and costs compile time only."""

    NAME = "cutetune-early-prefetch"

    def __init__(self, send: Callable[[list[GemmProblem]], None], key: str,
                 arch: Callable[[torch.device], str | None],
                 user_pass: Callable[[torch.fx.Graph], None] | None = None) -> None:
        super().__init__(key, user_pass)
        self.send, self.arch = send, arch

    def apply(self, graph: torch.fx.Graph) -> None:
        try:
            problems = dynamo_gemms(graph, self.arch)
            if problems:
                self.send(problems)
        except Exception as e:  # noqa: BLE001
            log.warning("cutetune: early kernel prefetch failed (%s: %s); kernels are sent "
                        "at lowering", type(e).__name__, e)


DTYPES = (torch.bfloat16, torch.float16)
GEMV_DTYPES = (*DTYPES, torch.float32)


def _silu_mul_mm(g, x, w):
    return F.silu(g) * torch.mm(x, w)


def _mm_mul_silu(g, x, w):
    return torch.mm(x, w) * F.silu(g)


@lru_cache(maxsize=None)
def _patterns(dtype: torch.dtype) -> tuple:
    """The post-grad patterns of both operand orders in ``dtype`` (silu's decomposition casts
    to fp32 and back, so the dtype may be part of the pattern): traced for the dtypes a graph
    holds, once per process (0.02-0.06 s for both orders in the H200 benchmark's compiles, the
    fusion pass's log lines in data/bench/e2e_h200_1gpu_aot*.json.gz)."""
    from torch._inductor.pattern_matcher import fwd_only, gen_pattern

    t0 = time.perf_counter()
    g, x, w = (torch.empty(s, dtype=dtype) for s in ((8, 8), (8, 16), (16, 8)))
    out = tuple(gen_pattern(fn, [g, x, w], fwd_only) for fn in (_silu_mul_mm, _mm_mul_silu))
    log.info("cutetune: traced the SwiGLU patterns for %s in %.2f s", dtype,
             time.perf_counter() - t0)
    return out


def candidate_dtypes(graph: torch.fx.Graph) -> list[torch.dtype]:
    """The 16-bit dtypes of the graph's mm products that feed a mul: only these can match,
    so a graph without one (attention projections, most graphs) traces no pattern."""
    found = set()
    for node in graph.find_nodes(op="call_function", target=torch.ops.aten.mm.default):
        val = node.meta.get("val")
        if (isinstance(val, torch.Tensor) and val.dtype in DTYPES
                and any(u.target == torch.ops.aten.mul.Tensor for u in node.users)):
            found.add(val.dtype)
    return [d for d in DTYPES if d in found]


def _dynamic_m(x) -> bool:
    """Whether the up projection's M alone may be dynamic: a symbolic first size."""
    a = x.meta.get("val")
    return isinstance(a, torch.Tensor) and a.dim() == 2 and isinstance(a.shape[0], torch.SymInt) \
        and not isinstance(a.shape[0].node.maybe_as_int(), int)


class GemvPass(ChainedPass):
    """Under CUDA graphs, each one-row GEMM of the post-grad graph (``mm``, ``bmm``, and
    ``addmm`` with its defaults, as Inductor makes of mm plus a residual; 16-bit or fp32, as
    attention's products are on SDPA's math path; a static row, where ``arch(device)`` names
    a GPU) becomes the multiply and sum of a GEMV in fp32, cast back: the rewrite that
    Inductor's own decompositions make only with ``coordinate_descent_tuning`` on, as
    mode="max-autotune" has it. Inductor then fuses each GEMV into a reduction kernel with
    its neighbours (RMSNorm, residual adds, SwiGLU's product, attention's softmax), which no
    GEMM choice can do; under graphs fewer kernels also replay faster
    (data/bench/cudagraphs_small_m_h100.json.gz at M=1). With ``tune``, a graph it rewrote
    has its reductions tuned as max-autotune's are (``tune_reductions``): untuned, they fell
    short of the H200's bandwidth (data/bench/cudagraphs_small_m_h200.json.gz). Without
    graphs it stays: there a GEMM's choice weighs the host (``decisions.host_bound_us``)."""

    NAME = "cutetune-gemv"

    def __init__(self, key: str, arch: Callable[[torch.device], str | None],
                 user_pass: Callable[[torch.fx.Graph], None] | None = None,
                 tune: bool = True) -> None:
        super().__init__(f"{key}:{'tuned' if tune else 'untuned'}", user_pass)
        self.arch, self.tune = arch, tune

    def apply(self, graph: torch.fx.Graph) -> None:
        tune_reductions(False)  # each graph decides for its own kernels
        if not under_cuda_graphs():
            return
        aten = torch.ops.aten
        rewrote = False
        for node in [n for target in (aten.mm.default, aten.bmm.default, aten.addmm.default)
                     for n in graph.find_nodes(op="call_function", target=target)]:
            if node.target is aten.addmm.default:
                if len(node.args) != 3 or any(node.kwargs.get(k, 1) != 1
                                              for k in ("beta", "alpha")):
                    continue
                bias, x, w = node.args
            else:
                (x, w), bias = node.args, None
            if self._one_row(x, w):
                _replace_with_gemv(graph, node, x, w, bias)
                rewrote = True
                log.info("cutetune: one-row GEMM %s as a GEMV reduction (under CUDA graphs)",
                         tuple(w.meta["val"].shape))
        # Inductor's own graphs warm up before recording; a capture in progress would run the
        # tuning's benchmarks inside it.
        tune_reductions(rewrote and self.tune and bool(inductor_config.triton.cudagraphs))

    def _one_row(self, x, w) -> bool:
        vals = [getattr(t, "meta", {}).get("val") for t in (x, w)]
        return (all(isinstance(v, torch.Tensor) and v.dtype in GEMV_DTYPES for v in vals)
                and isinstance(vals[0].shape[-2], int) and vals[0].shape[-2] == 1
                and self.arch(vals[0].device) is not None)


# What max-autotune has Inductor do for its reductions: more first configs, then coordinate
# descent from the best of them.
REDUCTION_TUNING = ("max_autotune_pointwise", "coordinate_descent_tuning")
_turned_on: set[str] = set()  # of REDUCTION_TUNING, by tune_reductions, until the compile ends


def tune_reductions(on: bool) -> None:
    """Inductor's reduction tuning (``REDUCTION_TUNING``) on for the kernels of the graph
    being compiled (``on``), or back off where this module turned it on. Inductor reads the
    flags as it generates each kernel, after the post-grad passes, and the kernel keeps them:
    the tuning runs at its first call (under Inductor's graphs, a warm-up before the
    recording). Dynamo's compile-end callback, the next graph's pass and ``disable()`` turn
    them off again, so that later compiles are not tuned for this graph's sake. A flag the
    user or the mode set (max-autotune) is left on. Limits: where one Dynamo compile makes
    several graphs (a backward compiled with its forward, DDP's buckets), the next one is
    traced with the flags on until its pass runs (Inductor's own one-row decompositions,
    which this pass makes anyway under graphs, and its cache keys see them); a
    higher-order op's subgraph is decided by its parent graph's pass, which runs last."""
    from torch._dynamo import callback_handler

    if on:
        if _end_of_compile not in callback_handler.end_callbacks:
            callback_handler.register_end_callback(_end_of_compile)
        for name in REDUCTION_TUNING:
            if not getattr(inductor_config, name):
                setattr(inductor_config, name, True)
                _turned_on.add(name)
    else:
        while _turned_on:
            setattr(inductor_config, _turned_on.pop(), False)


def _end_of_compile(_args) -> None:
    tune_reductions(False)


def _replace_with_gemv(graph: torch.fx.Graph, node: torch.fx.Node, x, w, bias) -> None:
    """``node`` (``x @ w``, plus ``bias``) as ``(x[..., None] * w[..., None, :, :]).sum(-2)``
    in fp32, cast back: nodes made here with their fake values, a quarter of the compile
    time of tracing the rewrite for each match (``Match.replace_by_example``;
    data/reports/gemv_pass_cpu.json.gz)."""
    from torch._guards import detect_fake_mode

    aten, cast = torch.ops.aten, torch.ops.prims.convert_element_type.default
    fake = detect_fake_mode([x.meta["val"], w.meta["val"]])

    def call(target, *args):
        new = graph.call_function(target, args)
        with fake:
            new.meta["val"] = target(*(a.meta["val"] if isinstance(a, torch.fx.Node) else a
                                       for a in args))
        return new

    with graph.inserting_before(node):
        f32 = torch.float32
        product = call(aten.mul.Tensor, call(aten.unsqueeze.default, call(cast, x, f32), -1),
                       call(aten.unsqueeze.default, call(cast, w, f32), -3))
        out = call(aten.sum.dim_IntList, product, [-2])
        if bias is not None:
            out = call(aten.add.Tensor, call(cast, bias, f32), out)
        out = call(cast, out, node.meta["val"].dtype)
    node.replace_all_uses_with(out)
    graph.erase_node(node)


class SwigluFusionPass(ChainedPass):
    """``decide(problem) -> KernelConfig | None`` says, per up projection, which config to fuse
    with (``decide_by_m``, if given, at each rung of a dynamic M); ``key`` identifies what
    decides (it goes into ``uuid()``); ``arch(device)`` is quack's arch for a device, None
    where quack cannot run; ``prepare(problem, config)``, if given, is told of each fusion at
    once, to get the kernel ready while Inductor compiles; ``templated(graph, arch)``, if
    given, names the problems of the graph that Inductor will run in Triton templates, whose
    up projections of a static M stay unfused: a template takes the product as its epilogue
    for less host time than the fused kernel's extern call, which a graph templated for its
    host time cannot spare (in one process on the H200 the Llama-3-8B MLP's step at M 1, 16
    and 128 issued in 13-25 us less host time that way, and ran 0.83x the fused step's at
    M=16, host-bound, against 1.05x at M=1, where the GPU bound it:
    data/bench/step_h200_unfused.json.gz)."""

    NAME = "cutetune-swiglu"

    def __init__(self, decide: Callable[[GemmProblem], KernelConfig | None], key: str,
                 arch: Callable[[torch.device], str | None],
                 user_pass: Callable[[torch.fx.Graph], None] | None = None,
                 prepare: Callable[[GemmProblem, KernelConfig], None] | None = None,
                 decide_by_m: Callable[[GemmProblem], KernelConfig | None] | None = None,
                 templated: Callable[[torch.fx.Graph, str], Collection[GemmProblem]]
                 | None = None) -> None:
        super().__init__(key, user_pass)
        swiglu.install_lowerings()
        self.decide, self.arch, self.prepare = decide, arch, prepare
        self.templated = templated
        self.decide_by_m = decide_by_m or decide  # at each rung of a dynamic M
        self.fused: list[tuple[GemmProblem, KernelConfig]] = []  # what this process fused

    def apply(self, graph: torch.fx.Graph) -> None:
        from torch._inductor.pattern_matcher import PatternMatcherPass, register_graph_pattern

        matcher = PatternMatcherPass(pass_name="cutetune_swiglu")
        templated: dict[str, Collection[GemmProblem]] = {}  # per arch, of the graph as it came

        def rewrite(match, g, x, w):
            if _dynamic_m(x):
                return self._rewrite_by_m(match, g, x, w)
            try:
                problem = fx_problem(x, w, self.arch)
            except ProblemError as e:
                log.info("cutetune: SwiGLU left unfused (%s)", e)
                return
            if self.templated is not None:
                if problem.arch not in templated:
                    templated[problem.arch] = self.templated(graph, problem.arch)
                if problem in templated[problem.arch]:
                    log.info("cutetune: SwiGLU on %s left to its Triton template",
                             problem.key())
                    return
            config = self.decide(problem)
            if config is None:
                return
            ints = config_ints(config)
            match.replace_by_example(
                lambda g, x, w: torch.ops.cutetune.mm_silu_mul(x, w, g, ints), [g, x, w])
            self._fused(problem, config)
            log.info("cutetune: fused silu(gate) * mm on %s with %s", problem.key(),
                     config.short())

        dtypes = candidate_dtypes(graph)
        if not dtypes:
            return
        for pattern in (p for d in dtypes for p in _patterns(d)):
            register_graph_pattern(pattern, pass_dict=matcher)(rewrite)
        matcher.apply(graph)

    def _rewrite_by_m(self, match, g, x, w) -> None:
        """An up projection whose M is dynamic: fused per range of M (``launcher.m_ranges``)
        where ``decide_by_m`` fuses that range's rung, unfused elsewhere, chosen at each call
        by its M (``swiglu.mm_silu_mul_by_m``); left as it is where no range fuses."""
        firsts = {}  # each config with the problem at the first rung that fused with it

        def pick(m: int) -> KernelConfig | None:
            try:
                problem = fx_problem(x, w, self.arch, m)
            except ProblemError:
                return None
            config = self.decide_by_m(problem)
            if config is not None:
                firsts.setdefault(config, problem)
            return config

        table = launcher.m_ranges(pick)
        if not firsts:
            log.info("cutetune: SwiGLU with a dynamic M left unfused (no range fuses)")
            return
        ints = table_ints(table)
        match.replace_by_example(
            lambda g, x, w: torch.ops.cutetune.mm_silu_mul_by_m(x, w, g, ints), [g, x, w])
        for config, problem in firsts.items():
            self._fused(problem, config)
        log.info("cutetune: fused silu(gate) * mm with a dynamic M (%s): %s",
                 x.meta["val"].shape[0], ", ".join(
                     f"M<={m_max}: {'unfused' if c is None else c.short()}" for m_max, c in table))

    def _fused(self, problem: GemmProblem, config: KernelConfig) -> None:
        self.fused.append((problem, config))
        if self.prepare is not None:
            self.prepare(problem, config)


class GroupedMmPass(ChainedPass):
    """A post-grad pass that gives each grouped GEMM of the graph, forward or backward
    (``aten._grouped_mm`` in quack's forms, and ``cutetune::grouped_mm`` without a table), the
    configs ``picker`` (``grouped_mm.Picker``) decides at compile time: for a static ragged
    size its pick there, for a dynamic one its pick per range of sizes (``Picker.table``), so
    one compiled graph serves every size. A node whose every range the picker leaves to ATen
    stays as it is."""

    NAME = "cutetune-grouped"

    def __init__(self, picker, key: str, arch: Callable[[torch.device], str | None],
                 user_pass: Callable[[torch.fx.Graph], None] | None = None,
                 prepare: Callable[[list], None] | None = None, static: bool = True) -> None:
        super().__init__(key, user_pass)
        grouped_mm.install_lowering()
        self.picker, self.arch, self.prepare, self.static = picker, arch, prepare, static

    def apply(self, graph: torch.fx.Graph) -> None:
        ours = torch.ops.cutetune.grouped_mm.default
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target not in (_GROUPED_MM, ours):
                continue
            a, b, offs, fourth, out_dtype = (_arg(node, i, name) for i, name in enumerate(
                ("self", "mat2", "offs", "bias" if node.target is _GROUPED_MM else "table",
                 "out_dtype")))
            if offs is None or fourth is not None or out_dtype not in (None, _dtype(a)):
                continue  # no groups, a bias, another output dtype, or a table already
            kernels: dict = {}  # config -> a problem it serves
            table = self._table(a, b, offs, kernels, node.target is _GROUPED_MM)
            if table is None or (node.target is _GROUPED_MM and all(c is None for _, c in table)):
                continue
            if self.prepare is not None and kernels:
                self.prepare([(p, c) for c, p in kernels.items()])
            node.target, node.args, node.kwargs = ours, (a, b, offs, table_ints(table)), {}
            log.info("cutetune: grouped GEMM %s: %s", node.name, ", ".join(
                f"<={m}: {'ATen' if c is None else c.short()}" for m, c in table))

    def _table(self, a, b, offs, kernels: dict, aten: bool):
        """The node's configs by range of its ragged size, None where quack cannot run it or
        (``aten``: an aten._grouped_mm node) reduced mode's lowering benchmarks it."""
        va, vb, vo = (getattr(x, "meta", {}).get("val") for x in (a, b, offs))
        if not all(isinstance(t, torch.Tensor) for t in (va, vb, vo)):
            return None
        ragged = (0, 0) if vb.dim() == 3 else (1, 0)  # A's and B's dim that splits (B: wgrad)
        total = va.shape[ragged[0]]
        dynamic = not isinstance(total, int)
        if not dynamic and not self.static and aten:
            return None  # left to reduced mode's lowering, which wraps only aten's

        def problem_at(size: int):
            a_size = list(va.shape)
            a_size[ragged[0]] = size
            b_size = list(vb.shape)
            if vb.dim() == 2:
                b_size[0] = size
            return grouped_problem(
                static_ints(a_size, "A sizes"), static_ints(va.stride(), "A strides"),
                static_ints(b_size, "B sizes"), static_ints(vb.stride(), "B strides"),
                static_ints(vo.shape, "offsets")[0], va.dtype, va.dtype, self.arch(va.device))

        return self.picker.table(problem_at, dynamic, None if dynamic else total, kernels)


_GROUPED_MM = torch.ops.aten._grouped_mm.default


def _arg(node: torch.fx.Node, i: int, name: str):
    return node.args[i] if len(node.args) > i else node.kwargs.get(name)


def _dtype(x) -> torch.dtype | None:
    val = getattr(x, "meta", {}).get("val")
    return val.dtype if isinstance(val, torch.Tensor) else None
