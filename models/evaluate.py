"""How well a config ranking does on held-out problems: problem-grouped splits and metrics.

Everything here is pure: it sees measured times, a score per row (lower = predicted faster)
and the problem each row belongs to. A problem is never split between train and test, since
rows of one problem share everything but the config and would leak its timing scale.

Oracle efficiency of a pick is t_best / t_pick, where t_best is the fastest measured ok config
among the candidates ranked (for sampled problems: the configs that were measured).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..space.problem import GemmProblem, layout_name

M_BUCKETS = ((1, 64), (65, 512), (513, 4096), (4097, None))
# Grouped GEMMs by their routed rows (tokens x top-k): decode steps of a top-8 model up to 128
# tokens, then up to 1024, 8192 tokens, and beyond.
M_TOTAL_BUCKETS = ((1, 1024), (1025, 8192), (8193, 65536), (65537, None))
TOP_KS = (1, 5, 10)
# Graded relevance of a config by its slowdown over the problem's best: within 1% is grade 5,
# ... , beyond 20% is 0. Used by NDCG@5 and as the label of the ranking objectives, so the
# metric and the training target agree on what "near-optimal" means.
RELEVANCE_SLOWDOWNS = (0.01, 0.03, 0.05, 0.10, 0.20)
NDCG_K = 5


def bucket_name(lo: int, hi: int | None, label: str = "M") -> str:
    return f"{label} {lo}-{hi}" if hi else f"{label} >{lo - 1}"


def m_bucket(m: np.ndarray, buckets=M_BUCKETS) -> np.ndarray:
    """Index into ``buckets`` of each M."""
    edges = np.array([hi for _, hi in buckets[:-1]])
    return np.searchsorted(edges, np.asarray(m), side="left")


def relevance(time_ms: np.ndarray, best_ms: np.ndarray) -> np.ndarray:
    """Integer grade 0..5 of each row from its slowdown t / t_best - 1."""
    slowdown = np.asarray(time_ms) / np.asarray(best_ms) - 1.0
    grade = len(RELEVANCE_SLOWDOWNS) - np.searchsorted(
        np.array(RELEVANCE_SLOWDOWNS), slowdown, side="left")
    return grade.astype(np.int32)


def group_offsets(group: np.ndarray) -> np.ndarray:
    """Start offsets (plus the end) of runs of equal group ids; rows must be sorted by group."""
    group = np.asarray(group)
    if len(group) and np.any(np.diff(group) < 0):
        raise ValueError("rows must be sorted by problem")
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]]) if len(group) else np.array([], int)
    return np.r_[starts, len(group)]


# ---------------------------------------------------------------- splits
def group_kfold(n_problems: int, k: int, seed: int = 0, shapes: np.ndarray | None = None
                ) -> list[tuple[np.ndarray, np.ndarray]]:
    """K folds over problem indices (train, test): a shuffled, near-equal partition; with
    ``shapes`` (an index per problem), of the shapes, so problems of one shape share a fold."""
    ids = np.arange(n_problems) if shapes is None else np.unique(shapes)
    shapes = ids if shapes is None else shapes
    if not 2 <= k <= len(ids):
        raise ValueError(f"need 2 <= folds <= problems, got {k} folds for {len(ids)} problems"
                         + (f" ({n_problems} with their routings)"
                            if len(ids) != n_problems else ""))
    perm = ids[np.random.default_rng(seed).permutation(len(ids))]
    folds = [np.flatnonzero(np.isin(shapes, f)) for f in np.array_split(perm, k)]
    return [(np.sort(np.concatenate(folds[:i] + folds[i + 1:])), f)
            for i, f in enumerate(folds)]


def leave_family_out(families: np.ndarray) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(family, train, test) over problem indices, one split per family (model suite)."""
    families = np.asarray(families)
    names = sorted(set(families.tolist()))
    if len(names) < 2:
        raise ValueError(f"leave-one-family-out needs >= 2 families, got {names}")
    return [(f, np.flatnonzero(families != f), np.flatnonzero(families == f)) for f in names]


# ---------------------------------------------------------------- per-problem metrics
@dataclass(frozen=True)
class ProblemScores:
    """One value per problem. eff[k] is t_best / (best time among the top-k picks). ``m`` is
    the size the buckets split (M; a grouped problem's routed rows) and ``cublas_ms`` the ATen
    baseline's time (torch.mm's cuBLAS; a grouped problem's torch._grouped_mm)."""

    m: np.ndarray
    eff: dict[int, np.ndarray]
    tau: np.ndarray        # Kendall tau-b between scores and times (nan: < 2 distinct times)
    ndcg: np.ndarray       # NDCG@NDCG_K with graded relevance
    top1_ms: np.ndarray
    top1_row: np.ndarray   # index of the top-1 row among the rows scored
    best_ms: np.ndarray
    cublas_ms: np.ndarray  # nan where no baseline time was measured


def _ndcg(order: np.ndarray, rel: np.ndarray, k: int) -> float:
    gain = 2.0 ** rel - 1.0
    disc = 1.0 / np.log2(np.arange(2, k + 2))
    dcg = float(np.sum(gain[order[:k]] * disc[: min(k, len(order))]))
    ideal = float(np.sum(np.sort(gain)[::-1][:k] * disc[: min(k, len(order))]))
    return dcg / ideal if ideal > 0 else 1.0


def score_problems(time_ms: np.ndarray, scores: np.ndarray, group: np.ndarray, m: np.ndarray,
                   cublas_ms: np.ndarray, seed: int = 0) -> ProblemScores:
    """Metrics of ranking each problem's rows by ``scores`` (lower first).

    ``m`` and ``cublas_ms`` have one entry per problem in group order. Ties in ``scores`` (a
    heuristic that cannot tell two configs apart) are broken by a fixed random key, not row order.
    """
    time_ms, scores = np.asarray(time_ms, float), np.asarray(scores, float)
    off = group_offsets(group)
    n = len(off) - 1
    if len(m) != n or len(cublas_ms) != n:
        raise ValueError(f"{n} problems but {len(m)} M values and {len(cublas_ms)} cuBLAS times")
    tiebreak = np.random.default_rng(seed).random(len(time_ms))
    eff = {k: np.empty(n) for k in TOP_KS}
    from scipy.stats import kendalltau  # (seconds to import: not at `cutetune --help`)

    tau, ndcg, top1, best = (np.empty(n) for _ in range(4))
    top1_row = np.empty(n, np.int64)
    for p in range(n):
        t, s = time_ms[off[p]:off[p + 1]], scores[off[p]:off[p + 1]]
        order = np.lexsort((tiebreak[off[p]:off[p + 1]], s))
        best[p] = t.min()
        top1[p], top1_row[p] = t[order[0]], off[p] + order[0]
        for k in TOP_KS:
            eff[k][p] = best[p] / t[order[:k]].min()
        tau[p] = kendalltau(s, t).statistic if len(np.unique(t)) > 1 else np.nan
        ndcg[p] = _ndcg(order, relevance(t, best[p]), NDCG_K)
    return ProblemScores(np.asarray(m), eff, tau, ndcg, top1, top1_row, best,
                         np.asarray(cublas_ms, float))


# ---------------------------------------------------------------- aggregation
def geomean(x: np.ndarray) -> float:
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    return float(np.exp(np.mean(np.log(x)))) if len(x) else float("nan")


def _stats(x: np.ndarray) -> dict[str, float]:
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    if not len(x):
        return {"geomean": float("nan"), "p10": float("nan"), "min": float("nan")}
    return {"geomean": geomean(x), "p10": float(np.percentile(x, 10)), "min": float(x.min())}


def summarize(ps: ProblemScores, mask: np.ndarray | None = None) -> dict[str, float]:
    """Flat metric dict over the problems in ``mask`` (all by default)."""
    sel = np.ones(len(ps.m), bool) if mask is None else np.asarray(mask)
    out: dict[str, float] = {"problems": int(sel.sum())}
    for k in TOP_KS:
        for stat, v in _stats(ps.eff[k][sel]).items():
            out[f"top{k}_{stat}"] = v
    tau = ps.tau[sel]
    out["kendall_tau"] = float(np.nanmean(tau)) if np.isfinite(tau).any() else float("nan")
    out[f"ndcg@{NDCG_K}"] = float(np.mean(ps.ndcg[sel])) if sel.any() else float("nan")
    vs = ps.cublas_ms[sel] / ps.top1_ms[sel]
    out["vs_cublas_geomean"] = geomean(vs)
    finite = vs[np.isfinite(vs)]
    out["beats_cublas_frac"] = float(np.mean(finite > 1.0)) if len(finite) else float("nan")
    return out


def summarize_by_bucket(ps: ProblemScores, buckets=M_BUCKETS,
                        label: str = "M") -> dict[str, dict[str, float]]:
    """``summarize`` for all problems and for each bucket of their size (``ps.m``) that has
    problems."""
    out = {"all": summarize(ps)}
    for name, mask in bucket_masks(ps.m, buckets, label).items():
        out[name] = summarize(ps, mask)
    return out


def layout_masks(problems) -> dict[str, np.ndarray]:
    """Layout name (``layout_name``) -> mask of the dense problems in it, where they span more
    than one; empty for grouped problems."""
    if not problems or not isinstance(problems[0], GemmProblem):
        return {}
    return name_masks([layout_name(p) for p in problems])


def name_masks(names) -> dict[str, np.ndarray]:
    """Name -> mask of the items of that name, where ``names`` span more than one."""
    names = np.array(names)
    kinds = sorted(set(names.tolist()))
    return {k: names == k for k in kinds} if len(kinds) > 1 else {}


def bucket_masks(m: np.ndarray, buckets=M_BUCKETS, label: str = "M") -> dict[str, np.ndarray]:
    """Bucket name -> mask of the problems of that size, for each bucket that has problems."""
    b = m_bucket(m, buckets)
    return {bucket_name(lo, hi, label): b == i for i, (lo, hi) in enumerate(buckets)
            if np.any(b == i)}
