"""Which ATen fallback decides best per kind: the calibrated quantile regression, the same with
inputs that say when the pick may be wrong, or the classifier: the evidence behind each kind's
fallback objective (``models.train.KIND_DEFAULTS``).

For each split seed: out-of-fold scores of the pairwise ranker and the regression (model seed
0, problem-grouped K-fold), the kind's pick (ranker + weight x regression), then per variant
and quantile (a classifier's: its threshold), judged on the same folds as `cutetune train`
judges the fallback: predicted mode's geomean and worst problem against ATen, its share of the
per-problem oracle max(top-1, ATen), and the problems below 0.97 of that oracle. Variants:
``quantile`` (fallback_inputs), ``uncertainty`` (the quantile model, plus the time model's
least predicted time among the candidates, the pick's gap to it, the spread of the time
model's predictions over the pick's top 5, and whether both top-1s agree), ``classifier``,
and two classifiers told what ATen itself may take: ``classifier_aten_time`` (plus a
regression's predicted log ATen time, fit on the training folds' problems, each training
problem's value out of an inner 5-fold, and the pick's predicted margin over it) and, for
dense GEMMs, ``classifier_nvmmh`` (plus nvMatmulHeuristics' least estimated runtime for the
problem, and the pick's margin over it).

    python scripts/fallback_study.py --data data/inputs/h200_bf16 --kind dense --weight 0
        [--splits 0 1] [--quantiles ...] --out FILE
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial

import numpy as np

from blend_study import load, out_of_fold  # scripts/, on sys.path when run as a script
from cutetune.models.baselines import nvmmh_ranked
from cutetune.models.evaluate import group_kfold, group_offsets, score_problems
from cutetune.models.fallback import CublasFallback, fallback_inputs, held_out_levels, outcome
from cutetune.models.learners import blended


def uncertainty(pick_score: np.ndarray, log_ms: np.ndarray, group: np.ndarray, k: int = 5
                ) -> np.ndarray:
    """Per problem: least predicted log ms, pick's gap to it, spread over the top k, agree."""
    off = group_offsets(group)
    out = np.empty((len(off) - 1, 4))
    for p in range(len(off) - 1):
        s, t = pick_score[off[p]:off[p + 1]], log_ms[off[p]:off[p + 1]]
        top = t[np.argsort(s, kind="stable")[:k]]
        out[p] = [t.min(), top[0] - t.min(), np.ptp(top), float(t.argmin() == s.argmin())]
    return out


def aten_time(desc: np.ndarray, aten_ms: np.ndarray, shapes, train: np.ndarray,
              test: np.ndarray, inner: int = 5) -> np.ndarray:
    """Predicted log ATen ms per problem: ``test``'s from a regression fit on ``train``'s
    problems, each of ``train``'s from one fit without its inner fold (a shape's problems in
    one fold, as ``Measurements.folds`` keeps them; nan elsewhere)."""
    import xgboost as xgb

    def fit(rows):
        rows = rows[np.isfinite(aten_ms[rows])]
        params = {"objective": "reg:squarederror", "max_depth": 4, "eta": 0.05, "seed": 0,
                  "nthread": 1, "tree_method": "hist"}
        return xgb.train(params, xgb.DMatrix(desc[rows], label=np.log(aten_ms[rows])), 300)

    out = np.full(len(aten_ms), np.nan)
    inner_shapes = None if shapes is None else shapes[train]
    for fit_on, part in group_kfold(len(train), inner, 0, inner_shapes):
        out[train[part]] = fit(train[fit_on]).inplace_predict(desc[train[part]])
    out[test] = fit(train).inplace_predict(desc[test])
    return out


def with_margin(base: np.ndarray, log_ms: np.ndarray) -> np.ndarray:
    """``base`` (fallback_inputs: the pick's predicted log ms last) plus ``log_ms`` and the
    pick's margin over it."""
    return np.column_stack([base, log_ms, base[:, -1] - log_ms]).astype(np.float32)


def per_fold_levels(make, features, log_ratio, splits, quantiles) -> dict[float, np.ndarray]:
    """held_out_levels where the inputs depend on the fold: ``features(train, test)``."""
    pred = {q: np.full(len(log_ratio), np.nan) for q in quantiles}
    for train, test in splits:
        for q, p in held_out_levels(make, features(train, test), log_ratio, [(train, test)],
                                    quantiles).items():
            pred[q][test] = p[test]
    return pred


def judge(name, objective, q, pred, log_ratio) -> dict:
    o = outcome(q, pred, log_ratio, objective)
    r = log_ratio[np.isfinite(log_ratio)]
    chosen = np.where(pred[np.isfinite(log_ratio)] > 0, 0.0, r)
    of_oracle = np.exp(np.minimum(r, 0.0) - chosen)
    return {"variant": name, "quantile": q, "fallback_rate": o.fallback_rate,
            "speedup_vs_aten": o.speedup_vs_cublas, "worst_vs_aten": o.worst_vs_cublas,
            "regressed": o.regressed, "of_oracle": o.speedup_vs_cublas / o.oracle_vs_cublas,
            "below_097_of_oracle": int((of_oracle < 0.97).sum())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--kind", required=True)
    ap.add_argument("--weight", type=float, required=True, help="the kind's timer weight")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--splits", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--quantiles", nargs="+", type=float, default=[0.5, 0.6, 0.75, 0.9, 0.95])
    ap.add_argument("--out", required=True, help="JSON result path")
    args = ap.parse_args(argv)

    data, X, desc = load(args.data, args.kind)
    nvmmh = (np.log([nvmmh_ranked(p)[0][0] * 1e3 for p in data.problems])
             if args.kind == "dense" else None)
    classifier = partial(CublasFallback, objective="classifier")
    runs = []
    for split_seed in args.splits:
        splits = data.folds(args.folds, split_seed)
        ranker, timer = out_of_fold(data, X, splits, 0)
        score = blended(ranker, timer, args.weight)
        ps = score_problems(data.time_ms, score, data.group, data.m, data.cublas_ms)
        log_ratio = np.log(ps.top1_ms / data.cublas_ms)
        base = fallback_inputs(desc, timer[ps.top1_row])
        wide = np.column_stack([base, uncertainty(score, timer, data.group)]).astype(np.float32)
        fixed = [("quantile", CublasFallback, base), ("uncertainty", CublasFallback, wide),
                 ("classifier", classifier, base)]
        if nvmmh is not None:
            fixed.append(("classifier_nvmmh", classifier, with_margin(base, nvmmh)))
        variants = [(name, model, partial(held_out_levels, model, Xf))
                    for name, model, Xf in fixed]
        variants.append(("classifier_aten_time", classifier, partial(
            per_fold_levels, classifier, lambda train, test, base=base: with_margin(
                base, aten_time(desc, data.cublas_ms, data.shapes, train, test)))))
        for name, model, levels_of in variants:
            levels = levels_of(log_ratio, splits, args.quantiles)
            for q, pred in levels.items():
                row = judge(name, model().objective, q, pred, log_ratio) | {
                    "split_seed": split_seed}
                runs.append(row)
                print(" ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                               for k, v in row.items()), flush=True)
    with open(args.out, "w") as f:
        json.dump({"data": args.data, "kind": args.kind, "weight": args.weight,
                   "folds": args.folds, "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
