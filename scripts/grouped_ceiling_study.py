"""What bounds the grouped cost model's held-out top-1: the routing, which the host does not
know, against the learner's own settings.

The shipped recipe (the pairwise ranker plus 4 x the time model's log time, KIND_DEFAULTS) is
scored problem-grouped K-fold over several split seeds three ways:

  host       the shipped features (experts, routed rows, N, K and what follows from them)
  slower     the same features, half the learning rate and twice the trees
  routing    the shipped features plus the measured routing of each problem: its largest
             expert over the mean, the counts' coefficient of variation, the share of empty
             experts, log2 of the largest expert's rows, and per config the largest expert's
             blocks of the ragged dimension (ragged_block: a cluster's rows, or a K tile).
             The host learns these only by reading the offsets back from the GPU, which
             predicted mode, CUDA graphs and an eager call without a sync cannot do: a bound
             on what host-known features can reach, not a model to ship.
  balanced   trained as routing, asked with every problem's routing taken as balanced (each
             expert the mean rows): what assuming a load-balanced router would give.

Each variant's top-1 is also split by the measured routing's kind: balanced (counts' CV below
0.3), skewed, or empty (over a fifth of the experts without rows).

    python scripts/grouped_ceiling_study.py --out data/reports/grouped_ceiling_study_h200_bf16.json
        [--data data/inputs/h200_bf16_grouped] [--split-seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from cutetune.models.crossval import held_out_scores
from cutetune.models.data import load_measurements
from cutetune.models.evaluate import summarize
from cutetune.models.features import dataset_features
from cutetune.models.learners import BoosterModel
from cutetune.models.methods import Method, blend_method
from cutetune.models.train import KIND_DEFAULTS
from cutetune.space.device import device_for
from cutetune.space.features import GROUPED_FEATURE_NAMES

ROUTING_NAMES = ("max_over_mean", "counts_cv", "empty_share", "log2_max_rows", "max_row_tiles")


def measured_routing(data) -> np.ndarray:
    """(problems, 5): each problem's measured routing (``Measurements.routings``): the
    largest expert over the mean, the counts' CV, the share of empty experts, and the largest
    expert's rows (log2 of it plus one, and itself)."""
    out = []
    for routing in data.routings:
        c = np.asarray(json.loads(routing), np.float64)
        mean = max(c.mean(), 1e-9)
        out.append((c.max() / mean, c.std() / mean, float(np.mean(c == 0)),
                    np.log2(c.max() + 1), c.max()))
    return np.asarray(out)


def routing_features(routing: np.ndarray, data, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows, len(ROUTING_NAMES)) twice: each row's problem's ``measured_routing`` with the
    largest expert's blocks of the ragged dimension under the row's config (the features'
    ragged_block), and the same for a balanced routing of the problem's routed rows."""
    per_row = routing[data.group]
    block = X[:, GROUPED_FEATURE_NAMES.index("ragged_block")]
    experts = np.array([p.experts for p in data.problems])
    mean_rows = np.ceil(data.m / experts)[data.group]  # data.m: the ragged total
    zero = np.zeros(len(X))
    return (np.column_stack([per_row[:, :4], np.ceil(per_row[:, 4] / block)]),
            np.column_stack([zero + 1, zero, zero, np.log2(mean_rows + 1),
                             np.ceil(mean_rows / block)]))


def routing_kinds(routing: np.ndarray) -> np.ndarray:
    """Per problem of ``measured_routing``: "balanced", "skewed" or "empty" (see the module
    docstring)."""
    cv, empty = routing[:, 1], routing[:, 2]
    return np.where(empty > 0.2, "empty", np.where(cv < 0.3, "balanced", "skewed"))


def asked_balanced(method: Method, n: int) -> Method:
    """``method`` fit on the first ``n`` columns and scored on the host columns plus the last
    ones (the balanced routing's) of a matrix [host, measured routing, balanced routing]."""
    host = n - len(ROUTING_NAMES)
    return Method(method.name, method.description,
                  lambda d, X: method.score(d, np.hstack([X[:, :host], X[:, n:]])),
                  lambda d, X: method.fit(d, X[:, :n]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="data/inputs/h200_bf16_grouped")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--split-seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True, help="JSON result path")
    args = ap.parse_args(argv)

    data = load_measurements(args.data, "grouped")
    X = dataset_features(data, device_for(data.device_name))
    routing = measured_routing(data)
    R, Rb = routing_features(routing, data, X)
    Xr = np.hstack([X, R]).astype(np.float32)
    Xrb = np.hstack([X, R, Rb]).astype(np.float32)
    kinds = routing_kinds(routing)
    weight = KIND_DEFAULTS["grouped"].timer_weight
    base = {"n_estimators": BoosterModel.n_estimators, "max_depth": BoosterModel.max_depth,
            "n_threads": args.threads, "kind": "grouped"}
    slower = {**base, "n_estimators": 2 * base["n_estimators"],
              "learning_rate": BoosterModel.learning_rate / 2}
    variants = {"host": (X, base), "slower": (X, slower), "routing": (Xr, base),
                "balanced": (Xrb, base)}
    runs = []
    for split_seed in args.split_seeds:
        splits = data.folds(args.folds, split_seed)
        for name, (features, params) in variants.items():
            method = blend_method("rank:pairwise", weight, 0, **params)
            if name == "balanced":
                method = asked_balanced(method, Xr.shape[1])
            ps = held_out_scores(data, features, method, splits).problems
            s = summarize(ps)
            run = {"variant": name, "split_seed": split_seed,
                   **{k: s[k] for k in ("top1_geomean", "top1_p10", "top1_min", "top5_geomean")},
                   "top1_geomean_by_routing": {r: summarize(ps, kinds == r)["top1_geomean"]
                                               for r in ("balanced", "skewed", "empty")}}
            runs.append(run)
            print(json.dumps(run), flush=True)
    mean = {name: {k: float(np.mean([r[k] for r in runs if r["variant"] == name]))
                   for k in ("top1_geomean", "top1_p10", "top5_geomean")} for name in variants}
    with open(args.out, "w") as f:
        json.dump({"command": " ".join(["python", *sys.argv]), "data": args.data,
                   "problems": data.n_problems, "folds": args.folds,
                   "routing_features": ROUTING_NAMES,
                   "problems_by_routing": {r: int((kinds == r).sum())
                                           for r in ("balanced", "skewed", "empty")},
                   "mean_over_split_seeds": mean, "runs": runs}, f, indent=1)
    print(json.dumps(mean, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
