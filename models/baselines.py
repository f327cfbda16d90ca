"""The heuristics a cost model must beat, as rankings of a problem's measured configs.

A heuristic names one config (or a short list); the dataset may not hold exactly that config,
so it is scored by its distance to each measured one and the nearest measured config stands
in for it (the report says how often the exact pick was measured). Distances add log2 ratios
of tile and cluster extents and split-K, plus fixed costs for a different orientation (swap_ab),
mode (pingpong), scheduler (dynamic persistent) or swizzle.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Mapping

import numpy as np

from ..space.config import KernelConfig
from ..space.enumerate import enumerate_configs
from ..space.features import config_columns
from ..space.problem import GemmProblem

SWAP_COST, PINGPONG_COST, DYNAMIC_COST, SWIZZLE_COST = 4.0, 0.5, 0.5, 0.25
NVMMH_GPU = {"sm90": "H200_SXM", "sm100": "B200"}
NVMMH_PRECISION = {"bf16": "TST", "fp16": "HSH"}  # nvMatmulHeuristics.h: T=bf16, H=fp16, S=fp32
NVMMH_COUNT = 8  # picks asked per orientation: enough to fill a top-10 from both


def config_distance(cols: Mapping[str, np.ndarray], c: KernelConfig) -> np.ndarray:
    """Distance of each row of config columns to config ``c`` (0 for the same config)."""
    return columns_distance(cols, config_columns([c]))


def columns_distance(cols: Mapping[str, np.ndarray], other: Mapping[str, np.ndarray]
                     ) -> np.ndarray:
    """``config_distance`` between config columns, broadcast numpy-wise: rows (1, R) against
    candidates (C, 1) give every pair's distance."""
    lg = lambda name: np.abs(np.log2(np.asarray(cols[name], float) / other[name]))  # noqa: E731
    differ = lambda name: (np.asarray(cols[name]).astype(bool)  # noqa: E731
                           != np.asarray(other[name]).astype(bool))
    return (lg("tile_m") + lg("tile_n") + lg("cluster_m") + lg("cluster_n") + lg("split_k")
            + SWAP_COST * differ("swap_ab") + PINGPONG_COST * differ("pingpong")
            + DYNAMIC_COST * differ("is_dynamic_persistent")
            + SWIZZLE_COST * (np.asarray(cols["max_swizzle_size"])
                              != np.asarray(other["max_swizzle_size"])))


def map_onto(configs, picks: list[KernelConfig]) -> list[KernelConfig]:
    """Each pick as itself when in ``configs``, else as its nearest config there; in pick
    order, without duplicates."""
    configs = list(configs)
    cols = config_columns(configs)
    return list(dict.fromkeys(configs[int(np.argmin(config_distance(cols, c)))] for c in picks))


def rank_by_picks(cols: Mapping[str, np.ndarray], picks: list[KernelConfig]) -> np.ndarray:
    """Scores that put the nearest unused row to pick 0 first, then to pick 1, ...; the other
    rows follow by distance to their nearest pick."""
    n = len(cols["tile_m"])
    if not picks:
        return np.zeros(n)
    dist = np.stack([config_distance(cols, p) for p in picks])
    score = len(picks) + dist.min(axis=0)
    used = np.zeros(n, bool)
    for j in range(min(len(picks), n)):
        i = int(np.argmin(np.where(used, np.inf, dist[j])))
        score[i], used[i] = j, True
    return score


# ---------------------------------------------------------------- quack's own choices
@lru_cache(maxsize=None)
def quack_sm90_list() -> tuple[KernelConfig, ...]:
    """quack's sm90 autotuning list (gemm_config._get_sm90_configs: 44 configs) mapped onto
    our space: each to itself when valid, else to its nearest valid config (128x224 is not on
    our tile_n axis), without duplicates."""
    from quack.gemm_config import _get_sm90_configs

    space = enumerate_configs("sm90")
    return tuple(map_onto(space, [
        KernelConfig(q.tile_m, q.tile_n, q.pingpong, q.cluster_m, q.cluster_n, q.swap_ab,
                     q.max_swizzle_size, q.split_k, q.is_dynamic_persistent)
        for q in _get_sm90_configs()]))


def in_configs(cols: Mapping[str, np.ndarray], configs) -> np.ndarray:
    """Which rows of config columns are one of ``configs``."""
    table = config_columns(list(configs))
    names = list(table)
    rows = np.stack([np.asarray(cols[k]).astype(np.int64) for k in names], axis=1)
    want = {tuple(r) for r in np.stack([table[k] for k in names], axis=1).tolist()}
    return np.array([tuple(r) in want for r in rows.tolist()], bool)


# ---------------------------------------------------------------- nvMatmulHeuristics
@lru_cache(maxsize=None)
def _nvmmh(gpu: str):
    """One library handle and hardware descriptor per GPU for the process. nvMatmulHeuristics
    0.1.0 segfaults destroying a handle that has answered queries (the wrapper's __del__ does,
    at exit at the latest), so ours is never destroyed; the OS frees it at exit."""
    import nvMatmulHeuristics as nv

    class Interface(nv.NvMatmulHeuristicsInterface):
        def __del__(self) -> None:
            pass

    iface = Interface(backend=nv.NvMatmulHeuristicsTarget.CUTLASS3)
    hw = iface.createHardwareDescriptor()
    iface.setHardwarePredefinedGpu(hw, getattr(nv.NvMatmulHeuristicsNvidiaGpu, gpu))
    return iface, hw, set()


def _layout(a_k_major: bool, b_k_major: bool, row_major_out: bool):
    """nvMMH layout name: BLAS column-major letters, so a K-major A is 'T' and a K-major B 'N'."""
    import nvMatmulHeuristics as nv

    name = ("T" if a_k_major else "N") + ("N" if b_k_major else "T")
    return getattr(nv.NvMatmulHeuristicsMatmulLayout, name + ("_ROW_MAJOR" if row_major_out
                                                             else "_COL_MAJOR"))


def nvmmh_ranked(problem: GemmProblem, count: int = NVMMH_COUNT
                 ) -> list[tuple[float, KernelConfig]]:
    """nvMatmulHeuristics' configs for ``problem`` as ours, with their estimated runtimes (s),
    least first.

    As quack's nvmmh_heuristic does, both orientations are asked (D = A B row-major, and the
    swapped D^T = B^T A^T column-major, i.e. swap_ab) and merged by estimated runtime; pingpong
    is quack's rule (sm90 and tile_m <= 128). Not mapped onto the valid space here."""
    iface, hw, loaded = _nvmmh(NVMMH_GPU[problem.arch])
    iface.precision = NVMMH_PRECISION[problem.dtype]
    a_k, b_k = problem.a_major == "k", problem.b_major == "k"
    found = []
    for swap, layout, (m, n) in ((False, _layout(a_k, b_k, True), (problem.m, problem.n)),
                                 (True, _layout(b_k, a_k, False), (problem.n, problem.m))):
        if layout not in loaded:
            iface.loadInternalDiscoverySet(layout, hw)
            loaded.add(layout)
        asked = iface.makeNvMatmulHeuristicsProblem(m, n, problem.k, layout, problem.batch)
        for r in iface.get(asked, count, hardware_descriptor=hw):
            g = r["kernel"]
            pp = problem.arch == "sm90" and g.cta_tile_m <= 128
            found.append((r["runtime"], KernelConfig(
                g.cta_tile_m, g.cta_tile_n, pp, g.cluster_m, g.cluster_n, swap, 8,
                max(1, g.split_k), problem.arch == "sm100")))
    found.sort(key=lambda t: t[0])
    return found


def nvmmh_picks(problem: GemmProblem, count: int = NVMMH_COUNT) -> list[KernelConfig]:
    """nvmmh_ranked's configs, without repeats."""
    return list(dict.fromkeys(c for _, c in nvmmh_ranked(problem, count)))


@lru_cache(maxsize=4096)
def nvmmh_valid_picks(problem: GemmProblem) -> list[KernelConfig]:
    """nvmmh_picks mapped onto the problem's valid configs (nearest valid config)."""
    return map_onto(enumerate_configs(problem.arch, problem), nvmmh_picks(problem))
