"""`cutetune train`: evaluate the cost model and its baselines on held-out problems, then fit
the shipped model on all problems and write it with the evaluation report.

Held-out evaluation: problem-grouped K-fold CV for every method, and leave-one-family-out
(family = the dataset's suite: an LLM's layers, an MoE model's expert GEMMs) for the learned
models and the heuristics. The XGBoost objective with the best held-out top-1 efficiency is
the one shipped (see _choose). The ATen fallback (cuBLAS; torch._grouped_mm for grouped
problems) is fit on the shipped model's out-of-fold picks (see fallback.py) and judged by a
second K-fold over problems on those picks.

A model ranks one kind of problem (``kinds``), the kind of ``data``: the same code trains the
dense and the grouped model, reading the kind's features, baseline and size buckets.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .. import progress
from ..artifacts import package_versions
from ..space.device import device_for
from ..space.problem import layout_name

from .artifact import CostModel
from .crossval import HeldOut, held_out_scores, scored
from .data import Measurements, check_joinable, with_extra
from .evaluate import (bucket_masks, layout_masks, leave_family_out, summarize,
                       summarize_by_bucket)
from .fallback import CublasFallback, FallbackOutcome, fallback_inputs, held_out_levels, outcome
from .features import dataset_features, problem_descriptors
from .learners import BoosterModel, blended
from .methods import BLEND_NAMES, XGB_NAMES, Method, baseline_methods, blend_method, xgb_methods

FALLBACK_QUANTILES = (0.5, 0.75, 0.9)
RANKER_MARGIN = 0.005


@dataclass(frozen=True)
class KindDefaults:
    """Options whose default differs by problem kind (see docs/grouped.md for the evidence)."""

    fallback_quantile: float  # a classifier's: its threshold (fallback.CublasFallback)
    fallback_objective: str  # fallback.OBJECTIVES
    # weight of the time model's log time added to a ranking objective's score (0: no blend)
    timer_weight: float
    objectives: tuple[str, ...]  # XGBoost objectives tried, regression first (the time model)


# Grouped problems: few measured configs per dgrad/wgrad problem, where the ranking objective
# alone misorders, and a torch._grouped_mm that is near the best on large problems, where a
# bolder fallback quantile loses to it. Dense problems: a top-1 within a few percent of cuBLAS
# either way, where the classifier decides better than the regression's quantile, and where
# the NDCG ranker never beat the pairwise one beyond noise (data/reports/bf16_join_h200.json.gz).
KIND_DEFAULTS = {"dense": KindDefaults(0.75, "classifier", 0.0, ("regression", "rank:pairwise")),
                 "grouped": KindDefaults(0.9, "quantile", 4.0,
                                         ("regression", "rank:pairwise", "rank:ndcg"))}


@dataclass(frozen=True)
class TrainOptions:
    folds: int = 5
    seed: int = 0
    n_estimators: int = BoosterModel.n_estimators
    max_depth: int = BoosterModel.max_depth
    objectives: tuple[str, ...] | None = None  # None: the kind's (KIND_DEFAULTS)
    baselines: bool = True
    family_out: bool = True
    fallback_quantile: float | None = None  # None: the kind's (KIND_DEFAULTS)
    fallback_objective: str | None = None  # None: the kind's (KIND_DEFAULTS)
    timer_weight: float | None = None  # None: the kind's (KIND_DEFAULTS)
    threads: int = 1  # per fit; more only pays on an otherwise idle machine

    def for_kind(self, kind: str) -> "TrainOptions":
        """These options with the kind's defaults filled in."""
        d = KIND_DEFAULTS[kind]
        return replace(self, fallback_quantile=d.fallback_quantile
                       if self.fallback_quantile is None else self.fallback_quantile,
                       fallback_objective=self.fallback_objective or d.fallback_objective,
                       timer_weight=d.timer_weight if self.timer_weight is None
                       else self.timer_weight,
                       objectives=d.objectives if self.objectives is None else self.objectives)


@dataclass
class Evaluation:
    """Everything the report shows; metrics are held-out."""

    kind: str
    arch: str
    dtype: str
    device: str
    problems: int
    rows: int
    failed_rows: int
    families: dict[str, int]
    swept: np.ndarray  # per problem: every valid config measured
    chosen: str
    cv: dict[str, HeldOut]
    cv_summary: dict[str, dict[str, dict[str, float]]]
    lofo_summary: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    fallback: list[FallbackOutcome] = field(default_factory=list)
    fallback_quantile: float | None = None
    fallback_objective: str = "quantile"
    # the shipped quantile's outcome on the problems of each size bucket
    fallback_by_bucket: dict[str, FallbackOutcome] = field(default_factory=dict)
    # per method, per layout (evaluate.layout_masks: where the problems span several)
    by_layout: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    extra: dict | None = None  # what joined every fit (train's ``extra``): problems, rows, dtypes


def _single(values, what: str) -> str:
    vals = sorted(set(values))
    if len(vals) != 1:
        raise ValueError(f"a cost model is trained per {what}; the dataset has {vals}")
    return vals[0]


def train(data: Measurements, options: TrainOptions = TrainOptions(),
          extra: Measurements | None = None) -> tuple[CostModel, Evaluation]:
    """The model of ``data``'s problems and its evaluation on them. ``extra``, dense
    measurements of the same arch and device in another dtype, joins every fit of the learned
    methods (a held-out fold's fit less the fold's layers and held-out family:
    ``crossval.held_out_scores``) but is never scored: one dtype's configs rank alike in
    another (docs/results.md), so it lends the layouts that ``data`` was not measured in. The
    baselines fit on ``data`` alone, as without it."""
    arch = _single((p.arch for p in data.problems), "arch")
    dtype = _single((p.dtype for p in data.problems), "dtype")
    if data.n_problems < options.folds:
        raise ValueError(f"{data.n_problems} problems cannot fill {options.folds} CV folds")
    device = device_for(data.device_name)
    kind = data.kind
    options = options.for_kind(kind.name)
    if "regression" not in options.objectives:
        raise ValueError("the regression objective is required: it is the model's time predictor")
    X = dataset_features(data, device)
    aux = None
    if extra is not None:
        check_joinable(data, extra)
        aux = (extra, dataset_features(extra, device))
    params = {"n_estimators": options.n_estimators, "max_depth": options.max_depth,
              "n_threads": options.threads, "kind": kind.name}
    xgb = xgb_methods(options.objectives, options.seed, **params)
    blends = {o: blend_method(o, options.timer_weight, options.seed, **params)
              for o in options.objectives if o in BLEND_NAMES} if options.timer_weight else {}
    learned = xgb + list(blends.values())
    baselines = baseline_methods(arch, options.seed, options.n_estimators, options.threads,
                                 kind) if options.baselines else []

    splits = data.folds(options.folds, options.seed)
    cv = _held_out(data, X, xgb, splits, options.seed, "cross-validation", aux)
    cv.update(_held_out(data, X, baselines, splits, options.seed, "cross-validation"))
    cv.update(_blends_held_out(data, cv, blends, options.timer_weight, splits, options.seed))
    cv = {m.name: cv[m.name] for m in learned + baselines}  # in the report's order
    chosen = _choose(cv, [m.name for m in learned])
    per_family = {str(k): int(v) for k, v in
                  zip(*np.unique(data.families.astype(str), return_counts=True))}
    ev = Evaluation(kind.name, arch, dtype, device.name, data.n_problems, len(data.time_ms),
                    data.failed_rows, per_family, data.swept, chosen, cv,
                    {n: summarize_by_bucket(h.problems, kind.buckets, kind.bucket_label)
                     for n, h in cv.items()})
    if data.swept.any():
        for n, h in cv.items():
            ev.cv_summary[n]["swept"] = summarize(h.problems, data.swept)
    layouts = layout_masks(data.problems)
    ev.by_layout = {n: {k: summarize(h.problems, m) for k, m in layouts.items()}
                    for n, h in cv.items()} if layouts else {}
    if extra is not None:
        ev.extra = {"problems": extra.n_problems, "rows": len(extra.time_ms),
                    "dtypes": sorted({p.dtype for p in extra.problems})}

    if options.family_out and len(ev.families) > 1:
        families = data.families
        lofo = leave_family_out(families)
        lofo_splits = [(tr, te) for _, tr, te in lofo]
        chosen_method = [x for x in learned if x.name == chosen]
        held = {**_held_out(data, X, chosen_method, lofo_splits, options.seed,
                            "leave-family-out", aux, family_out=True),
                **_held_out(data, X, baselines, lofo_splits, options.seed, "leave-family-out")}
        for name, h in held.items():
            ev.lofo_summary[name] = {fam: summarize(h.problems, families == fam)
                                     for fam, _, _ in lofo}

    fit_data, fit_X = (data, X) if aux is None else with_extra(data, X, aux)
    ranker = _final(chosen, options, fit_X, fit_data)
    timer = ranker if ranker.predicts_time else _final(XGB_NAMES["regression"], options, fit_X,
                                                       fit_data)
    timer_weight = options.timer_weight if chosen in BLEND_NAMES.values() else 0.0
    fallback = None
    if np.isfinite(data.cublas_ms).any():
        fallback, ev.fallback, ev.fallback_by_bucket = _fallback(data, device, cv, chosen, splits,
                                                                 options)
        ev.fallback_quantile = options.fallback_quantile
        ev.fallback_objective = options.fallback_objective
    metadata = {
        "objective": ranker.objective, "timer_weight": timer_weight, "trained_on": {
            "problems": data.n_problems, "rows": len(data.time_ms), "device": data.device_name,
            "families": ev.families, **({"extra": dict(ev.extra)} if ev.extra else {}),
            # the layouts its own dataset measured: those its fallback and its held-out figures
            # saw (a joined dtype lends the ranker more; CostModel.measured_layout)
            "layouts": sorted({layout_name(p) for p in data.problems})},
        "held_out_cv": ev.cv_summary[chosen]["all"], "cv_folds": options.folds,
        "seed": options.seed, "packages": _versions()}
    return CostModel(arch, dtype, device, ranker, timer, fallback, metadata,
                     timer_weight), ev


def _held_out(data: Measurements, X: np.ndarray, methods: list[Method], splits, seed: int,
              desc: str, extra=None, family_out: bool = False) -> dict[str, HeldOut]:
    """``held_out_scores`` of each method, a progress bar over their fits (method x fold)."""
    with progress.bar(len(methods) * len(splits), desc, unit="fit") as bar:
        out = {}
        for m in methods:
            bar.set_postfix_str(m.name)
            out[m.name] = held_out_scores(data, X, m, splits, seed, on_fold=bar.update,
                                          extra=extra, family_out=family_out)
        return out


def _blends_held_out(data: Measurements, cv: dict[str, HeldOut], blends: dict[str, Method],
                     weight: float, splits, seed: int) -> dict[str, HeldOut]:
    """Each blend's held-out scores (``blends``: by ranking objective) from those of its ranker
    and of the regression in ``cv``: on the same folds, their fold models are the blend's, so
    fitting the blend would fit them again."""
    log_ms = cv[XGB_NAMES["regression"]].row_scores
    return {b.name: scored(data, b, blended(cv[XGB_NAMES[o]].row_scores, log_ms, weight), splits,
                           seed) for o, b in blends.items()}


def _choose(cv: dict[str, HeldOut], names: list[str]) -> str:
    """The regression model unless a ranking objective (alone or blended with the time model)
    beats its held-out top-1 geomean by more than RANKER_MARGIN: a ranker ships a second booster (the time model) and so costs
    twice the prediction time, which a difference within noise does not pay for."""
    top1 = {n: summarize(cv[n].problems)["top1_geomean"] for n in names}
    best = max(names, key=top1.get)
    regression = XGB_NAMES["regression"]
    return best if top1[best] > top1[regression] + RANKER_MARGIN else regression


def _final(name: str, options: TrainOptions, X: np.ndarray, data: Measurements) -> BoosterModel:
    """The booster of method ``name`` fit on all of ``data`` (a blend's: its ranker)."""
    obj = {v: k for names in (XGB_NAMES, BLEND_NAMES) for k, v in names.items()}[name]
    return BoosterModel(objective=obj, n_estimators=options.n_estimators,
                        max_depth=options.max_depth, seed=options.seed,
                        n_threads=options.threads, kind=data.kind.name).fit(
        X, data.time_ms, data.group)


def _fallback(data: Measurements, device, cv: dict[str, HeldOut], chosen: str, splits,
              options: TrainOptions
              ) -> tuple[CublasFallback, list[FallbackOutcome], dict[str, FallbackOutcome]]:
    """Fit the fallback on out-of-fold picks, and judge it per quantile on held-out problems
    (the shipped quantile also per size bucket).

    The pick's predicted time is the regression model's out-of-fold prediction at the pick
    (the chosen ranker may predict no time). Judging reuses the CV folds over problems: the
    fallback of fold f is fit on the picks of the other folds, whose models did see fold f's
    problems; the picks themselves (the fallback's targets) are all out-of-fold."""
    picks = cv[chosen].problems
    timer_scores = cv[XGB_NAMES["regression"]].row_scores
    Xf = fallback_inputs(problem_descriptors(data.problems, device, data.kind),
                         timer_scores[picks.top1_row])
    log_ratio = np.log(picks.top1_ms / data.cublas_ms)
    objective = options.fallback_objective
    outcomes, by_bucket = [], {}
    for q, pred in held_out_levels(
            lambda: CublasFallback(seed=options.seed, objective=objective), Xf, log_ratio, splits,
            sorted(set(FALLBACK_QUANTILES) | {options.fallback_quantile})).items():
        outcomes.append(outcome(q, pred, log_ratio, objective))
        if q == options.fallback_quantile:
            by_bucket = {name: outcome(q, pred[mask], log_ratio[mask], objective)
                         for name, mask in
                         bucket_masks(data.m, data.kind.buckets, data.kind.bucket_label).items()}
    final = CublasFallback(options.fallback_quantile, seed=options.seed,
                           objective=objective).fit(Xf, log_ratio)
    return final, outcomes, by_bucket


def _versions() -> dict[str, str]:
    names = ("cutetune", "xgboost", "scikit-learn", "numpy", "quack-kernels")
    return {k: v or "not installed" for k, v in package_versions(names).items()}
