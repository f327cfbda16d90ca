"""When to run ATen instead of the model's pick: a calibrated quantile of the pick's slowdown,
or a classifier's probability that the pick is faster.

ATen is the problem kind's baseline (``kinds.ProblemKind.baseline``): torch.mm, which runs
cuBLAS, for a dense GEMM, and torch._grouped_mm for a grouped one; "cuBLAS" below stands for
either. The target per problem is log(t_pick / t_cuBLAS), measured, where the pick is the
cost model's top-1 chosen WITHOUT having seen the problem (an out-of-fold pick): an in-sample
pick would be too good and the fallback too bold. The inputs are the problem-only features and
the cost model's predicted log time of its pick.

Objective "quantile": a small XGBoost regression predicts the target; its ``quantile``
quantile is that prediction plus the ``quantile`` quantile of its own out-of-fold residuals
(split-conformal calibration: with a few hundred problems a directly fitted quantile model
comes out badly calibrated). Predicted mode falls back to cuBLAS unless that quantile is below
zero, i.e. unless the model is ``quantile``-confident that its pick beats cuBLAS.

Objective "classifier": a small XGBoost classifier predicts P(t_pick < t_cuBLAS); predicted
mode falls back unless it exceeds ``quantile``. Where the pick wins and loses by a few percent
(dense GEMMs), the regression's residual spread swamps the margin and its quantile keeps
cuBLAS nearly everywhere; the sign alone is what the decision needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # imported where used: `cutetune --help` needs neither
    import xgboost as xgb

from .learners import booster_from_dict, booster_to_dict

CALIBRATION_FOLDS = 5
OBJECTIVES = ("quantile", "classifier")
REGRESSION = 0.02  # a choice this much slower than cuBLAS counts as a regression (> noise)


def fallback_inputs(descriptors: np.ndarray, pick_log_ms: np.ndarray) -> np.ndarray:
    return np.column_stack([descriptors, pick_log_ms]).astype(np.float32)


@dataclass
class CublasFallback:
    """The fallback model (named for a dense GEMM's baseline; a grouped model's compares its
    pick with torch._grouped_mm the same way)."""

    quantile: float = 0.75  # a classifier's: the least P(pick faster) that runs the pick
    n_estimators: int = 100
    max_depth: int = 3
    learning_rate: float = 0.05
    seed: int = 0
    offset: float = 0.0  # the quantile of the out-of-fold residuals, set by fit
    objective: str = "quantile"  # OBJECTIVES (files older than the field: "quantile")
    booster: xgb.Booster | None = field(default=None, repr=False)
    # a quantile fit's out-of-fold residuals, for ``at`` (not saved)
    residual: np.ndarray | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown fallback objective {self.objective!r}; known: "
                             f"{', '.join(OBJECTIVES)}")

    def _train(self, X: np.ndarray, y: np.ndarray, objective: str = "reg:squarederror"
               ) -> xgb.Booster:
        import xgboost as xgb

        params = {"objective": objective, "max_depth": self.max_depth,
                  "eta": self.learning_rate, "seed": self.seed, "nthread": 1,
                  "tree_method": "hist"}
        return xgb.train(params, xgb.DMatrix(X, label=y), num_boost_round=self.n_estimators)

    def fit(self, X: np.ndarray, log_ratio: np.ndarray) -> "CublasFallback":
        """``X`` from fallback_inputs; ``log_ratio`` = log(t_pick / t_cuBLAS) per problem
        (nan where either time is missing)."""
        ok = np.isfinite(log_ratio)
        if ok.sum() < CALIBRATION_FOLDS:
            raise ValueError(f"the ATen fallback needs >= {CALIBRATION_FOLDS} problems with "
                             f"both a pick and an ATen time, got {int(ok.sum())}")
        X, y = X[ok], log_ratio[ok]
        if self.objective == "classifier":
            self.booster = self._train(X, (y < 0).astype(np.float32), "binary:logistic")
            return self
        folds = np.array_split(np.random.default_rng(self.seed).permutation(len(y)),
                               CALIBRATION_FOLDS)
        residual = np.empty(len(y))
        for f in folds:
            train = np.setdiff1d(np.arange(len(y)), f)
            residual[f] = y[f] - self._train(X[train], y[train]).inplace_predict(X[f])
        self.residual, self.offset = residual, float(np.quantile(residual, self.quantile))
        self.booster = self._train(X, y)
        return self

    def at(self, quantile: float) -> "CublasFallback":
        """This fitted fallback at another ``quantile``, sharing its booster: the level is only
        a classifier's threshold, and only picks the quantile of a quantile model's residuals
        that is its offset; no booster depends on it, so one fit serves every level judged."""
        if self.objective == "classifier":
            return replace(self, quantile=quantile)
        if self.residual is None:
            raise RuntimeError("CublasFallback.at needs the residuals of a fit")
        return replace(self, quantile=quantile, offset=float(np.quantile(self.residual, quantile)))

    def predict(self, X: np.ndarray) -> np.ndarray:
        """The ``quantile`` quantile of log(t_pick / t_cuBLAS), a classifier's ``quantile``
        less P(pick faster): > 0 means fall back."""
        if self.booster is None:
            raise RuntimeError("CublasFallback.predict before fit")
        y = self.booster.inplace_predict(X).astype(np.float64)
        return self.quantile - y if self.objective == "classifier" else y + self.offset

    def to_dict(self) -> dict:
        return {"params": {k: getattr(self, k) for k in ("quantile", "n_estimators", "max_depth",
                                                          "learning_rate", "seed", "offset",
                                                          "objective")},
                **booster_to_dict(self.booster)}

    @classmethod
    def from_dict(cls, d: dict) -> "CublasFallback":
        model = cls(**d["params"])
        model.booster = booster_from_dict(d)
        return model


def held_out_levels(make, X: np.ndarray, log_ratio: np.ndarray, splits, quantiles
                    ) -> dict[float, np.ndarray]:
    """Per level of ``quantiles``: each problem's prediction by ``make()`` (a CublasFallback)
    fit on the other folds' problems that have an ATen time, one fit per fold serving every
    level (``CublasFallback.at``); ``splits`` as ``evaluate.group_kfold`` gives them, nan for
    a problem no split tests."""
    pred = {q: np.full(len(log_ratio), np.nan) for q in quantiles}
    for train, test in splits:
        ok = train[np.isfinite(log_ratio[train])]
        if ok.size:
            model = make().fit(X[ok], log_ratio[ok])
            for q in quantiles:
                pred[q][test] = model.at(q).predict(X[test])
    return pred


@dataclass(frozen=True)
class FallbackOutcome:
    """Held-out effect of the fallback rule at one quantile (times are geomean ratios)."""

    quantile: float
    fallback_rate: float
    coverage: float            # share of problems whose true log ratio is <= the predicted
                               # quantile (nan for a classifier: it predicts no quantile)
    speedup_vs_cublas: float   # always-cuBLAS time / chosen time
    speedup_vs_top1: float     # always-top-1 time / chosen time
    top1_vs_cublas: float      # always-cuBLAS time / always-top-1 time (no fallback)
    oracle_vs_cublas: float    # the better of the two per problem, for reference
    regressed: float           # share of problems where the choice is > REGRESSION slower than cuBLAS
    problems: int
    worst_vs_cublas: float     # the least t_cuBLAS / t_chosen over the problems


def outcome(quantile: float, predicted: np.ndarray, log_ratio: np.ndarray,
            objective: str = "quantile") -> FallbackOutcome:
    """Effect of falling back where ``predicted`` > 0, on problems with a finite ``log_ratio``
    (``predicted`` from a fallback of ``objective``)."""
    ok = np.isfinite(log_ratio)
    q, r = predicted[ok], log_ratio[ok]
    fall = q > 0
    chosen = np.where(fall, 0.0, r)  # log(t_chosen / t_cuBLAS)
    gm = lambda x: float(np.exp(np.mean(x))) if len(x) else float("nan")  # noqa: E731
    return FallbackOutcome(
        quantile=quantile, fallback_rate=float(fall.mean()) if len(r) else float("nan"),
        coverage=float(np.mean(r <= q)) if len(r) and objective == "quantile" else float("nan"),
        speedup_vs_cublas=gm(-chosen), speedup_vs_top1=gm(r - chosen), top1_vs_cublas=gm(-r),
        oracle_vs_cublas=gm(-np.minimum(r, 0.0)),
        regressed=float(np.mean(chosen > np.log1p(REGRESSION))) if len(r) else float("nan"),
        problems=int(ok.sum()),
        worst_vs_cublas=float(np.exp(-chosen.max())) if len(r) else float("nan"))
