"""How the ranker's blend with the time model and the fallback quantile fare over several CV
splits and seeds, by layout where the problems span several: the evidence behind a kind's
defaults (``models.train.KIND_DEFAULTS``).

For each (split seed, model seed): out-of-fold scores of the pairwise ranker and the
regression, problem-grouped K-fold; then for each timer weight the blend's held-out top-1
geomean and P10, and for each fallback quantile predicted mode's geomean and worst problem
against the ATen baseline (the fallback fit as `cutetune train` fits it, with the kind's
objective, on the same folds).

    python scripts/blend_study.py [--data data/inputs/h200_bf16_grouped] [--kind grouped]
        [--seeds 0:0 0:1 1:0 2:2] [--weights 0 2 4 8] [--quantiles 0.75 0.9 0.95] --out FILE
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from cutetune.models.crossval import held_out_scores
from cutetune.models.data import load_measurements
from cutetune.models.evaluate import layout_masks, score_problems, summarize
from cutetune.models.fallback import CublasFallback, fallback_inputs, held_out_levels, outcome
from cutetune.models.features import dataset_features, problem_descriptors
from cutetune.models.learners import BoosterModel, blended
from cutetune.models.methods import xgb_methods
from cutetune.models.train import KIND_DEFAULTS
from cutetune.space.device import device_for


def load(path: str, kind: str):
    """The measurements, their row features and their problem descriptors."""
    data = load_measurements(path, kind)
    device = device_for(data.device_name)
    return (data, dataset_features(data, device),
            problem_descriptors(data.problems, device, data.kind))


def out_of_fold(data, X: np.ndarray, splits, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Out-of-fold row scores of the pairwise ranker and of the regression (log ms)."""
    params = {"n_estimators": BoosterModel.n_estimators, "max_depth": BoosterModel.max_depth,
              "kind": data.kind.name}
    return tuple(held_out_scores(data, X, m, splits, seed).row_scores for m in
                 xgb_methods(("rank:pairwise", "regression"), seed, **params))


def _top1(summary: dict) -> dict:
    """What the study keeps of a summary: the problems and the top-1's geomean and P10."""
    return {k: summary[k] for k in ("problems", "top1_geomean", "top1_p10")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="data/inputs/h200_bf16_grouped")
    ap.add_argument("--kind", default="grouped")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seeds", nargs="+", default=["0:0", "0:1", "1:0", "2:2"],
                    help="SPLIT_SEED:MODEL_SEED pairs")
    ap.add_argument("--weights", nargs="+", type=float, default=[0.0, 2.0, 4.0, 8.0])
    ap.add_argument("--quantiles", nargs="+", type=float, default=[0.75, 0.9, 0.95])
    ap.add_argument("--out", required=True, help="JSON result path")
    args = ap.parse_args(argv)

    data, X, desc = load(args.data, args.kind)
    layouts = layout_masks(data.problems)
    objective = KIND_DEFAULTS[args.kind].fallback_objective  # as `cutetune train` fits it
    runs = []
    for pair in args.seeds:
        split_seed, seed = map(int, pair.split(":"))
        splits = data.folds(args.folds, split_seed)
        ranker, timer = out_of_fold(data, X, splits, seed)
        for w in args.weights:
            ps = score_problems(data.time_ms, blended(ranker, timer, w), data.group, data.m,
                                data.cublas_ms, seed=seed)
            s = summarize(ps)
            run = {"split_seed": split_seed, "seed": seed, "timer_weight": w,
                   "top1_geomean": s["top1_geomean"], "top1_p10": s["top1_p10"],
                   "top1_min": s["top1_min"], "fallback": [],
                   "by_layout": {name: _top1(summarize(ps, mask))
                                 for name, mask in layouts.items()}}
            Xf = fallback_inputs(desc, timer[ps.top1_row])
            log_ratio = np.log(ps.top1_ms / data.cublas_ms)
            levels = held_out_levels(lambda: CublasFallback(seed=seed, objective=objective),
                                     Xf, log_ratio, splits, args.quantiles)
            for q, pred in levels.items():
                o = outcome(q, pred, log_ratio, objective)
                run["fallback"].append({"quantile": q, "fallback_rate": o.fallback_rate,
                                        "speedup_vs_aten": o.speedup_vs_cublas,
                                        "worst_vs_aten": o.worst_vs_cublas})
            runs.append(run)
            fb = "  ".join(f"q{f['quantile']:g}: {f['speedup_vs_aten']:.3f}x worst "
                           f"{f['worst_vs_aten']:.3f}" for f in run["fallback"])
            lay = "  ".join(f"{n} {v['top1_geomean']:.3f}/{v['top1_p10']:.3f}"
                            for n, v in run["by_layout"].items())
            print(f"split {split_seed} seed {seed} weight {w:g}: top-1 {run['top1_geomean']:.4f}"
                  f" P10 {run['top1_p10']:.3f} | {fb} | {lay}", flush=True)
    with open(args.out, "w") as f:
        json.dump({"data": args.data, "kind": args.kind, "folds": args.folds, "runs": runs},
                  f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
