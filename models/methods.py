"""Every config-selection method the report compares, behind one interface.

A method is fit on the training problems' measurements and then scores each row of held-out
measurements (lower = chosen first). Heuristics ignore the training data. ``ranks`` is False
for the autotuner baseline, which measures its list and keeps the fastest: it has a top-1 but
no ranking to judge (its top-k, tau and NDCG are not reported).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..space.config import KernelConfig, quack_default_config

from .data import Measurements
from .dataset import CONFIG_COLUMNS
from .evaluate import group_offsets
from .baselines import (columns_distance, config_distance, in_configs, nvmmh_valid_picks,
    quack_sm90_list, rank_by_picks)
from .kinds import DENSE, ProblemKind
from .learners import OBJECTIVES, BoosterModel, HGBModel, blended


@dataclass
class Method:
    name: str
    description: str
    score: Callable[[Measurements, np.ndarray], np.ndarray]
    fit: Callable[[Measurements, np.ndarray], None] = lambda data, X: None
    ranks: bool = True
    # Per problem: was the heuristic's own pick among the measured configs (else the nearest
    # measured config stood in)? None for methods that pick from the measured rows directly.
    coverage: Callable[[Measurements], np.ndarray] | None = field(default=None, repr=False)


def learned(name: str, description: str, make) -> Method:
    """A method around a fresh learner (``make()``) with fit(X, time_ms, group)/predict(X)."""
    box = {}

    def fit(data: Measurements, X: np.ndarray) -> None:
        box["model"] = make().fit(X, data.time_ms, data.group)

    return Method(name, description, lambda data, X: box["model"].predict(X), fit)


def _per_problem(data: Measurements, fn) -> np.ndarray:
    """Concatenate ``fn(problem, row_slice)`` over the problems of ``data``."""
    return np.concatenate([fn(p, r) for p, r in zip(data.problems, _slices(data))])


def _slices(data: Measurements) -> list[slice]:
    off = group_offsets(data.group)
    return [slice(off[i], off[i + 1]) for i in range(data.n_problems)]


def _any_per_problem(data: Measurements, fn) -> np.ndarray:
    """Per problem: does ``fn(problem, row_slice)`` (a row mask) hold for any of its rows?"""
    return np.array([bool(fn(p, r).any()) for p, r in zip(data.problems, _slices(data))])


def _cols(data: Measurements, rows: slice) -> dict:
    return {k: v[rows] for k, v in data.cols.items()}


def nvmmh_method() -> Method:
    def score(data, X):
        return _per_problem(data, lambda p, r: rank_by_picks(_cols(data, r),
                                                             nvmmh_valid_picks(p)))

    def coverage(data):
        return _any_per_problem(data, lambda p, r: in_configs(_cols(data, r),
                                                              nvmmh_valid_picks(p)[:1]))

    return Method("nvmmh", "nvMatmulHeuristics picks (H200 model, both orientations, by its "
                  "runtime estimate) mapped to the nearest valid config, then to the nearest "
                  "measured one", score, coverage=coverage)


def quack_default_method(arch: str) -> Method:
    default = quack_default_config(arch)

    return Method("quack_default", f"quack's default config ({default.short()}), nearest "
                  "measured config", lambda data, X: config_distance(data.cols, default),
                  coverage=lambda data: _any_per_problem(
                      data, lambda p, r: in_configs(_cols(data, r), [default])))


def best_fixed_config(data: Measurements) -> KernelConfig:
    """The measured config that, run on every problem of ``data``, gives the best geomean
    top-1 efficiency there: chosen in hindsight. A problem that did not measure a candidate
    counts it at its nearest measured config (the first, among equally near ones), the
    stand-in the evaluation scores such picks by."""
    table = np.stack([np.asarray(data.cols[k]).astype(np.int64) for k in CONFIG_COLUMNS], axis=1)
    candidates, config_id = np.unique(table, axis=0, return_inverse=True)
    cand = {k: candidates[:, j] for j, k in enumerate(CONFIG_COLUMNS)}
    # distance[c, j]: from candidate c to candidate j, each a config some row measured
    distance = columns_distance({k: v[None, :] for k, v in cand.items()},
                                {k: v[:, None] for k, v in cand.items()})
    log_eff = np.zeros(len(candidates))
    for rows in _slices(data):
        t, ids = data.time_ms[rows], config_id[rows]
        row_of = np.full(len(candidates), -1)
        row_of[ids] = np.arange(len(ids))
        missing = row_of < 0  # candidates this problem did not measure: nearest one instead
        row_of[missing] = np.argmin(distance[np.ix_(missing, ids)], axis=1)
        log_eff += np.log(t.min() / t[row_of])
    best = candidates[np.argmax(log_eff)]
    return KernelConfig.from_dict(dict(zip(CONFIG_COLUMNS, best.tolist())))


def best_fixed_method() -> Method:
    box = {}

    def fit(data, X):
        box["config"] = best_fixed_config(data)

    return Method("best_fixed", "the one config with the best top-1 geomean on the training "
                  "problems (chosen in hindsight there), nearest measured config",
                  lambda data, X: config_distance(data.cols, box["config"]), fit,
                  coverage=lambda data: _any_per_problem(
                      data, lambda p, r: in_configs(_cols(data, r), [box["config"]])))


def quack_autotune_method() -> Method:
    """quack's autotuner over its sm90 list: the fastest measured config of that list. Exact
    only where the whole list was measured (its coverage); elsewhere it is the best of the part
    measured, or, with none of it measured, an arbitrary row."""
    configs = quack_sm90_list()

    def score(data, X):
        return np.where(in_configs(data.cols, configs), data.time_ms, np.inf)

    return Method("quack_autotune", f"best measured of quack's {len(configs)}-config sm90 "
                  "autotune list (an oracle over measurements: costs that many benchmarks)",
                  score, ranks=False, coverage=lambda data: np.array(
                      [in_configs(_cols(data, r), configs).sum() >= len(configs)
                       for r in _slices(data)]))


def missing_baseline_packages(kind: ProblemKind = DENSE) -> list[str]:
    """The pip packages (the "baselines" extra) that ``baseline_methods`` of ``kind`` need and
    this environment lacks, so that training refuses before its minutes, not in them."""
    import importlib.util

    needed = {"sklearn": "scikit-learn"}
    if kind is DENSE:
        needed["nvMatmulHeuristics"] = "nvidia-matmul-heuristics"
    return [pip for module, pip in needed.items() if importlib.util.find_spec(module) is None]


def baseline_methods(arch: str, seed: int = 0, n_estimators: int = 300,
                     n_threads: int = 1, kind: ProblemKind = DENSE) -> list[Method]:
    """The baselines of problems of ``kind``. nvMatmulHeuristics and quack's autotune list
    are dense GEMMs' only: nvMatmulHeuristics describes a problem by M, N, K, batch and layout
    (no ragged dimension to ask it about), and the list is mapped onto the dense space; quack's
    sm100 list is not mapped onto ours."""
    dense = kind is DENSE
    return [
        learned("sklearn_hgb", "scikit-learn HistGradientBoosting on log time",
                lambda: HGBModel(max_iter=n_estimators, seed=seed, n_threads=n_threads)),
        Method("roofline", f"analytic roofline time of the config (space.features "
               f"{kind.roofline})", lambda data, X: X[:, kind.roofline_idx].astype(float)),
        best_fixed_method(),
        *([nvmmh_method()] if dense else []),
        quack_default_method(arch),
        *([quack_autotune_method()] if dense and arch == "sm90" else []),
        Method("random", "uniformly random order (fixed seed)",
               lambda data, X: np.random.default_rng(seed).random(len(X))),
    ]


XGB_NAMES = {obj: "xgb_" + obj.removeprefix("rank:") for obj in OBJECTIVES}
# A ranking objective's score plus a weight times the time model's log time (see blend_method).
BLEND_NAMES = {obj: f"{XGB_NAMES[obj]}+regression" for obj in OBJECTIVES if obj != "regression"}


def xgb_methods(objectives=OBJECTIVES, seed: int = 0, **params) -> list[Method]:
    """The XGBoost variants tried (named by XGB_NAMES); the best held-out one is shipped."""
    unknown = set(objectives) - set(OBJECTIVES)
    if unknown:
        raise ValueError(f"unknown objective(s) {sorted(unknown)}; known: {', '.join(OBJECTIVES)}")
    return [learned(XGB_NAMES[obj], f"XGBoost, {obj} objective",
                    lambda obj=obj: BoosterModel(objective=obj, seed=seed, **params))
            for obj in objectives]


def blend_method(objective: str, weight: float, seed: int = 0, **params) -> Method:
    """A ranking objective's score plus ``weight`` x the regression's predicted log time.

    The ranker orders configs well where many were measured, the time model where few were
    (it learns times, not orders within a problem); the sum takes both. Both scores are
    per-config, so the blend ranks any candidate set the same way (no per-set scaling)."""
    box = {}

    def fit(data: Measurements, X: np.ndarray) -> None:
        box["models"] = [BoosterModel(objective=obj, seed=seed, **params).fit(
            X, data.time_ms, data.group) for obj in (objective, "regression")]

    def score(data: Measurements, X: np.ndarray) -> np.ndarray:
        ranker, timer = box["models"]
        return blended(ranker.predict(X), timer.predict(X), weight)

    return Method(BLEND_NAMES[objective], f"XGBoost, {objective} objective plus {weight:g} x "
                  "the regression's log time", score, fit)
