"""Learned scorers of (problem, config) feature rows: fit on measured times, predict a score
per row where lower means faster.

``BoosterModel`` is the XGBoost model cutetune ships, with three objectives:
- ``regression``: squared error on log(time / roofline time). Dividing by the config's roofline
  estimate takes out the problem's scale, so the trees spend their splits on what the
  roofline gets wrong, and the score is a time (exp(score) * roofline) usable for fallback.
  The roofline is a column of the feature rows: which one is the problem kind's
  (``kinds.ProblemKind.roofline``), so a model records the kind of rows it reads.
- ``rank:pairwise`` / ``rank:ndcg``: learning-to-rank grouped by problem, on the graded
  relevance of ``evaluate.relevance``; they order configs but predict no time.
``HGBModel`` is the scikit-learn baseline (HistGradientBoosting on log time).
"""

from __future__ import annotations

import base64
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # imported where used: `cutetune --help` needs neither
    import xgboost as xgb
    from sklearn.ensemble import HistGradientBoostingRegressor

from .evaluate import group_offsets, relevance
from .kinds import kind_named

OBJECTIVES = ("regression", "rank:pairwise", "rank:ndcg")
MS_PER_S = 1e3


def booster_to_dict(booster: "xgb.Booster") -> dict:
    """A booster as JSON-safe text: UBJ, deflated (a third of the size, ~3 ms to inflate),
    base64."""
    raw = zlib.compress(bytes(booster.save_raw(raw_format="ubj")), 9)
    return {"booster_ubj_zlib_base64": base64.b64encode(raw).decode("ascii")}


def booster_from_dict(d: dict) -> "xgb.Booster":
    """The booster of ``booster_to_dict`` (or of a format-2 file's plain UBJ), predicting on
    one thread: a query is a few thousand rows at most, too few to pay for a thread team, and
    the tuner predicts while its compile workers hold the other cores."""
    import xgboost as xgb

    if "booster_ubj_zlib_base64" in d:
        raw = zlib.decompress(base64.b64decode(d["booster_ubj_zlib_base64"], validate=True))
    elif "booster_ubj_base64" in d:
        raw = base64.b64decode(d["booster_ubj_base64"], validate=True)
    else:
        raise ValueError("a booster's entry holds no booster")
    booster = xgb.Booster()
    booster.load_model(bytearray(raw))
    booster.set_param({"nthread": 1})
    return booster


def blended(ranker: np.ndarray, log_ms: np.ndarray, weight: float) -> np.ndarray:
    """A blend's scores from its ranker's and its time model's log time: the order a blended
    model file ranks by, and what training judges a blend on."""
    return ranker + weight * log_ms


def log_roofline_ms(X: np.ndarray, kind: str) -> np.ndarray:
    """The log roofline time in ms of feature rows of problems of ``kind``."""
    return np.log(X[:, kind_named(kind).roofline_idx].astype(np.float64) * MS_PER_S)


def best_per_row(time_ms: np.ndarray, group: np.ndarray) -> np.ndarray:
    """The problem's fastest time, broadcast to each of its rows."""
    off = group_offsets(group)
    best = np.minimum.reduceat(time_ms, off[:-1]) if len(time_ms) else np.array([])
    return np.repeat(best, np.diff(off))


@dataclass
class BoosterModel:
    objective: str = "regression"
    # Sized for the rank budget: all ~2400 sm90 configs of a problem, features included, in
    # < 10 ms on one CPU core (scripts/bench_rank.py); prediction cost is trees x depth.
    n_estimators: int = 300
    max_depth: int = 6
    learning_rate: float = 0.1
    subsample: float = 0.8
    colsample_bytree: float = 0.8
    min_child_weight: float = 2.0
    seed: int = 0
    n_threads: int = 1
    kind: str = "dense"  # of the problems whose feature rows it reads (kinds.KINDS)
    booster: xgb.Booster | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; known: {', '.join(OBJECTIVES)}")
        kind_named(self.kind)

    @property
    def predicts_time(self) -> bool:
        return self.objective == "regression"

    def _params(self) -> dict:
        p = {"max_depth": self.max_depth, "eta": self.learning_rate, "subsample": self.subsample,
             "colsample_bytree": self.colsample_bytree, "min_child_weight": self.min_child_weight,
             "seed": self.seed, "nthread": self.n_threads, "tree_method": "hist"}
        if self.predicts_time:
            return {**p, "objective": "reg:squarederror"}
        # Pairs drawn across the whole group ("mean"), not only around the current top-k: a
        # problem's measured configs are a sample, and their full order carries the signal.
        return {**p, "objective": self.objective, "lambdarank_pair_method": "mean",
                "lambdarank_num_pair_per_sample": 8, "ndcg_exp_gain": True}

    def fit(self, X: np.ndarray, time_ms: np.ndarray, group: np.ndarray) -> "BoosterModel":
        """``group`` is the problem index of each row; rows must be sorted by it."""
        import xgboost as xgb

        time_ms = np.asarray(time_ms, np.float64)
        if self.predicts_time:
            dm = xgb.DMatrix(X, label=np.log(time_ms) - log_roofline_ms(X, self.kind))
        else:
            dm = xgb.DMatrix(X, label=relevance(time_ms, best_per_row(time_ms, group)))
            dm.set_group(np.diff(group_offsets(group)))
        self.booster = xgb.train(self._params(), dm, num_boost_round=self.n_estimators)
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Predicted log time in ms (regression), or minus the ranking score: lower is faster."""
        if self.booster is None:
            raise RuntimeError("BoosterModel.predict before fit")
        raw = self.booster.inplace_predict(X).astype(np.float64)
        return raw + log_roofline_ms(X, self.kind) if self.predicts_time else -raw

    # ------------------------------------------------------------ serialization
    def to_dict(self) -> dict:
        if self.booster is None:
            raise RuntimeError("cannot serialize an unfitted BoosterModel")
        params = {k: getattr(self, k) for k in ("objective", "n_estimators", "max_depth",
                                                "learning_rate", "subsample", "colsample_bytree",
                                                "min_child_weight", "seed", "kind")}
        return {"params": params, **booster_to_dict(self.booster)}

    @classmethod
    def from_dict(cls, d: dict) -> "BoosterModel":
        model = cls(**d["params"])
        model.booster = booster_from_dict(d)
        return model


@dataclass
class HGBModel:
    """scikit-learn baseline: gradient-boosted trees on log time, no roofline normalization."""

    max_iter: int = 300
    learning_rate: float = 0.1
    seed: int = 0
    n_threads: int = 1
    model: HistGradientBoostingRegressor | None = field(default=None, repr=False)

    def fit(self, X: np.ndarray, time_ms: np.ndarray, group: np.ndarray) -> "HGBModel":
        # scikit-learn takes every core through OpenMP; on a shared 2-core machine spinning
        # thread teams cost more than they give, so the thread count is explicit.
        from sklearn.ensemble import HistGradientBoostingRegressor
        from threadpoolctl import threadpool_limits

        with threadpool_limits(self.n_threads, user_api="openmp"):
            self.model = HistGradientBoostingRegressor(
                max_iter=self.max_iter, learning_rate=self.learning_rate, random_state=self.seed,
                early_stopping=False).fit(X, np.log(time_ms))
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.model.predict(X)
