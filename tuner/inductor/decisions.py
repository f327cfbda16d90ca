"""What each GEMM node of a graph gets, decided from the heuristics and the problem alone:
no Inductor state, no GPU, so every rule can be tested on the CPU."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
from torch._inductor import config as inductor_config

from ...space.config import KernelConfig
from ...space.problem import GemmProblem, ProblemError
from ...space.rules import is_valid

from ...models.heuristics import HeuristicsError
from ...space.device import device_for
from ...space.features import ceiling_times_s
from ...space.problem import DTYPE_BYTES
from ...models.triton_mm import CONFIG_KEYS, QUACK_LAUNCH_HOST_US, host_bound
from ..kernels import launcher
from ..kernels.problems import graph_gemms

log = logging.getLogger(__name__)


# CuteDSL candidates per node in reduced mode: on held-out problems the best of the shipped
# ranker's top 5 reaches a geomean 0.998 of the measured best (data/reports/model_h200_bf16/
# metrics.json, top-5), and the replay bench's guided search reaches 0.99 of the oracle after a
# median of 2 kernels (data/reports/replay_sm90_bf16.md): 5 leaves room beyond that median.
REDUCED_TOP_K = 5


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
    weighed together (the heuristics' ``triton_problems``; none where it raises). Where the
    heuristics cannot weigh, or under CUDA graphs (each node takes its own pick by GPU time),
    nothing is weighed: ``([], None)``, without looking at the graph."""
    limit = host_bound_us()
    weigh = getattr(heuristics, "triton_problems", None)
    if weigh is None or limit <= 0:
        return [], None
    gemms = triton_candidates(graph_gemms(graph, arch), heuristics, limit)
    try:
        return gemms, frozenset(weigh(gemms))
    except HeuristicsError:
        return gemms, frozenset()


def gpu_time_decision(problem: GemmProblem, heuristics) -> NodeDecision | None:
    """By GPU time alone, for a problem whose candidates the heuristics' retime timed together
    (``models.gpu_times``): the one that ran it fastest, alone in either mode (Inductor's
    benchmark, L2-warm and brief, cannot improve on an L2-cold retime); None for another
    problem."""
    fastest = getattr(heuristics, "gpu_fastest", None)
    try:
        pick = None if fastest is None else fastest(problem)
    except HeuristicsError:
        return None
    if pick is None:
        return None
    kind, config = pick
    if kind == "quack" and not is_valid(config, problem.arch, problem):
        return None  # a stale file must not hand quack a config it rejects
    if kind == "quack":
        return NodeDecision((config,), False, "GPU-timed fastest: quack")
    if kind == "triton":
        return NodeDecision((), True, "GPU-timed fastest: Triton", leave=True,
                            triton_config=tuple(sorted(zip(CONFIG_KEYS, config))))
    return NodeDecision((), True, "GPU-timed fastest: ATen")


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
    them on ATen (``CuteTuneChoices.graph_triton``). With no host cost (``host_bound_us``
    0: under CUDA graphs) a problem whose candidates were timed together takes the fastest
    (``gpu_time_decision``)."""
    if isinstance(problem, ProblemError):
        return NodeDecision((), True, f"unsupported: {problem}", leave=True)
    timed = gpu_time_decision(problem, heuristics) if host_bound_us <= 0 else None
    if timed is not None:
        return timed
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


def under_cuda_graphs() -> bool:
    """Whether the graph being compiled will replay in a CUDA graph, which launches no kernel
    from the host: Inductor's cudagraphs (mode="reduce-overhead"), or a capture in progress
    (a first call compiled inside ``torch.cuda.graph``)."""
    return bool(inductor_config.triton.cudagraphs) or (
        torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def host_bound_us() -> float:
    """``decide``'s host-bound limit for the graph being compiled: none under CUDA graphs."""
    return 0.0 if under_cuda_graphs() else QUACK_LAUNCH_HOST_US


# Fuse an unmeasured up projection only where the pointwise kernel's traffic, at the device's
# ceilings, is at least this share of the GEMM's own ceiling time: fusing trades cuBLAS for
# quack's kernel. On the H200 (data/inputs/swiglu/swiglu_h200.json, swiglu_families_h200.json)
# the rule's config beat the unfused default on 11 of the 13 shapes at or above it (13-18 %), and
# at Llama-3-70B's 6.7 % ran 1.023, 0.960 and 0.938x at M 1024, 2048 and 4096.
MIN_POINTWISE_SHARE = 0.08


def pointwise_share(problem: GemmProblem) -> float:
    """Time of the unfused pointwise kernel's 3*M*N elements at the device's memory
    ceiling, over the GEMM's time at its ceiling (the larger of flops and bytes)."""
    dev = device_for(problem.arch)
    compute_s, memory_s = ceiling_times_s(problem, dev)
    pointwise_s = (3 * problem.m * problem.n * DTYPE_BYTES[problem.out_dtype]
                   / dev.mem_bw_bytes_per_s)
    return pointwise_s / max(compute_s, memory_s)


def fusion_config(problem: GemmProblem, heuristics,
                  min_share: float = MIN_POINTWISE_SHARE) -> KernelConfig | None:
    """The quack config to run ``silu(gate) * (a @ b)`` with for ``problem`` (the up
    projection), or None to leave the graph as it is. A problem the heuristics' SwiGLU table
    measured takes what the GPU said (``measured_fusions``). Otherwise: the heuristics' best
    valid config for the plain GEMM without split-K (a split K would apply silu to partial
    sums), where the saved pointwise traffic is worth at least ``min_share`` of the GEMM
    (``math.inf``: measured problems only)."""
    if problem.batch != 1:
        return None
    measured = getattr(heuristics, "swiglu_config", None)
    if measured is not None:
        known, config = measured(problem)
        if known:
            return config
    if pointwise_share(problem) < min_share:
        return None
    configs, _ = heuristics.lookup(problem)
    for c in configs:
        if c.split_k == 1 and is_valid(c, problem.arch, problem):
            return c
    return None


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
    data/bench/step_dynamic_h200_extern.json.gz). Under CUDA graphs (``host_bound_us`` 0) an up
    projection that ran fastest in a Triton template stays unfused: the template takes the
    pointwise product as its epilogue."""
    try:
        timed = gpu_time_decision(problem, heuristics) if host_bound_us <= 0 else None
        if timed is not None and timed.triton_config:
            return None
        if host_bound(problem, host_bound_us) is None:
            return fusion_config(problem, heuristics)
        return fusion_config(problem, heuristics,
                                    min_share=0.0 if dynamic_m else math.inf)
    except HeuristicsError:
        return None
