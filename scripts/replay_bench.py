"""Replay benchmark of the tuning strategies on a recorded dataset with exhaustive sweeps.

    python scripts/replay_bench.py [--dataset data/inputs/h200_bf16] \
        [--out data/reports/replay_sm90_bf16]

Held-out problems are the dataset's exhaustively swept ones (every valid config recorded).
They are split into problem-grouped folds; the cost model used on a fold's problems is the
shipped recipe (models.train's regression time model, TrainOptions defaults) trained on every
other problem of the dataset, never on the fold's. Random, TPE and CMA-ES run once per seed;
the model-guided, quack44 and nvMMH strategies do not depend on a seed and run once.
Writes OUT.md, OUT.json and OUT.png and prints the headline numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from cutetune.models.dataset import load
from cutetune.models.artifact import CostModel, ModelError, load_model
from cutetune.models.data import dataset_sha256, from_table
from cutetune.models.evaluate import group_kfold
from cutetune.models.features import dataset_features
from cutetune.models.learners import BoosterModel
from cutetune.models.train import TrainOptions
from cutetune.space.device import device_for
from cutetune.tuner.search.backends import BENCH_OVERHEAD_S, ReplayBackend
from cutetune.tuner.search.replay import (TARGET, exhaustive_problems, replay, summarize,
    write_report)
from cutetune.tuner.search.samplers import NVMMH_TOP_K, ModelGuidedSampler, RankedTimes, quack_list
from cutetune.tuner.search.study import Budget

STOCHASTIC = ("random", "tpe", "cmaes")
TARGET_KERNELS, TARGET_SPEEDUP = 4, 10.0
MODEL_DEFAULTS = ModelGuidedSampler.__init__.__kwdefaults__


def fit_cost_model(table: pa.Table, ranker_objective: str, options: TrainOptions) -> CostModel:
    """The shipped model's recipe (a ranker with ``ranker_objective`` and the regression time
    model, TrainOptions' trees and depth), fit on ``table``'s ok quack rows."""
    data = from_table(table)
    device = device_for(data.device_name)
    X = dataset_features(data, device)

    def fit(objective: str) -> BoosterModel:
        return BoosterModel(objective=objective, n_estimators=options.n_estimators,
                            max_depth=options.max_depth, seed=options.seed).fit(
            X, data.time_ms, data.group)

    timer = fit("regression")
    ranker = timer if ranker_objective == "regression" else fit(ranker_objective)
    p = data.problems[0]
    return CostModel(p.arch, p.dtype, device, ranker, timer)


def shipped_objective(arch: str, dtype: str) -> str:
    """The ranking objective of the shipped cost model (what `cutetune tune` uses)."""
    try:
        return load_model(None, arch, dtype).metadata["objective"]
    except (ModelError, KeyError) as e:
        raise SystemExit(f"error: cannot read the shipped model's objective ({e}); "
                         f"pass --ranker") from None


def fold_scorers(table: pa.Table, problems, folds: int, seed: int, ranker: str) -> dict:
    """problem_key -> cost model (as the guided search sees it) trained without that
    problem's fold."""
    options = TrainOptions(seed=seed)
    scorers = {}
    for i, (_, test) in enumerate(group_kfold(len(problems), folds, seed)):
        held = pa.array([problems[j].key() for j in test])
        train = table.filter(pc.invert(pc.is_in(table.column("problem_key"), held)))
        t0 = time.perf_counter()
        model = RankedTimes(fit_cost_model(train, ranker, options))
        print(f"fold {i + 1}/{folds}: trained on {train.num_rows} rows without {len(test)} "
              f"held-out problems ({time.perf_counter() - t0:.0f} s)", flush=True)
        scorers.update({problems[j].key(): model for j in test})
    return scorers


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="data/inputs/h200_bf16")
    ap.add_argument("--out", default="data/reports/replay_sm90_bf16")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--baseline-kernels", type=int, default=64,
                    help="kernel budget of random, TPE and CMA-ES")
    ap.add_argument("--model-kernels", type=int, default=64,
                    help="kernel cap of the model-guided search (it usually stops itself)")
    ap.add_argument("--strategies", default="model,random,tpe,cmaes,quack44,nvmmh")
    ap.add_argument("--problems", type=int, default=None, help="use only the first N problems")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--dev-problems", default="data/reports/replay_sm90_bf16_dev_problems.json",
                    help="JSON list of the problems the search defaults were chosen on; the "
                         "report also summarizes the problems outside it")
    ap.add_argument("--ranker", default=None,
                    help="XGBoost objective of the ranker (default: the shipped model's)")
    args = ap.parse_args(argv)

    t_start = time.perf_counter()
    table = load(args.dataset)
    backend = ReplayBackend(table)
    problems = exhaustive_problems(backend)[:args.problems]
    if len(problems) < args.folds:
        print(f"error: {len(problems)} exhaustively swept problems in {args.dataset}; need at "
              f"least {args.folds}", file=sys.stderr)
        return 2
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    arch, dtype = problems[0].arch, problems[0].dtype
    print(f"{len(problems)} exhaustively swept problems ({arch}/{dtype}) in {args.dataset}",
          flush=True)
    ranker = (args.ranker or shipped_objective(arch, dtype)) if "model" in strategies else None
    if ranker:
        print(f"cost models: {ranker} ranker + regression time model, {args.folds} folds",
              flush=True)
    scorers = fold_scorers(table, problems, args.folds, 0, ranker) if ranker else None

    budgets = {s: Budget(kernels=args.baseline_kernels) for s in STOCHASTIC}
    budgets["model"] = Budget(kernels=args.model_kernels)
    t_replay = time.perf_counter()
    runs = replay(backend, problems, strategies, list(range(args.seeds)), budgets, scorers,
                  workers=args.workers)
    dev = set(json.loads(Path(args.dev_problems).read_text())["problems"]
              if Path(args.dev_problems).is_file() else [])
    fresh = [r for r in runs if r.problem_key not in dev]
    n_fresh = len({r.problem_key for r in fresh})
    summaries = {f"All {len(problems)} problems": summarize(runs)}
    if dev and fresh:
        summaries[f"The {n_fresh} problems not used to choose the search defaults"] = \
            summarize(fresh)
    elapsed = time.perf_counter() - t_start
    devices = sorted(set(table.column("device_name").drop_null().to_pylist()))
    quack_in_space = len(quack_list(arch)) if arch == "sm90" else 0
    meta = {
        "title": f"{arch} {dtype} on {', '.join(devices)}",
        "facts": {
            "dataset": f"{args.dataset} (sha256 {dataset_sha256(args.dataset)[:16]}...)",
            "held-out problems": f"{len(problems)} (every valid config recorded)",
            "search defaults chosen on": f"{len(dev & {p.key() for p in problems})} of them "
                                         f"(listed in {args.dev_problems})",
            "seeds": f"{args.seeds} for {', '.join(s for s in strategies if s in STOCHASTIC)}; "
                     "1 for the seed-independent strategies",
            "budgets": f"{args.baseline_kernels} kernels for random/TPE/CMA-ES; model-guided "
                       f"capped at {args.model_kernels} kernels, stops itself first",
            "benchmark wall time": f"{elapsed:.0f} s ({time.perf_counter() - t_replay:.0f} s "
                                   f"replay) on this machine",
        },
        "method": [
            "Oracle: the fastest ok config of the exhaustive sweep. Efficiency after a step: "
            "t_oracle / best time measured so far.",
            "Tuning time is charged from the records: each compile key's build once (the "
            "largest compile_s recorded for it: quack caches builds, so later ones are cheap), "
            f"plus per measurement its recorded time x repetitions and {BENCH_OVERHEAD_S} s of "
            "overhead (the collector's GPU-worker time per measurement, see "
            "tuner/backends.py; a low estimate for one-at-a-time tuning). Exhaustive search "
            "of the same space "
            "(every valid config, every kernel built once) is the reference.",
            f"Cost model for a problem: the shipped recipe (XGBoost {ranker} ranker, whose "
            "order the guided search uses, on the scale of the XGBoost regression time model), "
            "trained on every dataset problem outside the problem's "
            f"{args.folds}-fold problem-grouped split; model-guided search prunes configs "
            f"predicted more than {MODEL_DEFAULTS['margin']:.0%} slower than the best measured "
            "(after one standard deviation of optimism), corrects the model online (affine fit "
            "+ Gaussian-process residuals) and stops when the expected gain is below "
            f"{MODEL_DEFAULTS['min_gain']:.1%}.",
            f"quack44: quack's sm90 autotuning list mapped onto the space by "
            f"models.heuristics ({quack_in_space} distinct configs), measured in quack's order.",
            f"nvmmh: nvMatmulHeuristics' top-{NVMMH_TOP_K} (models.heuristics.nvmmh_valid_picks, "
            "nearest valid config), measured in its order.",
            "Random/TPE/CMA-ES: Optuna samplers over per-axis integer parameters, invalid grid "
            "points repaired to the nearest valid config; a repeated config costs nothing.",
        ],
        "targets": [t for title, s in summaries.items() for t in _targets(s, title)],
    }
    files = write_report(runs, summaries, meta, args.out)
    print(f"wrote {', '.join(map(str, files))}")
    print(f"\nmedian compiled kernels to reach {TARGET} of the oracle; tuning time vs exhaustive "
          f"(median over runs of exhaustive time / strategy time until it stopped):")
    for s, v in summaries[next(iter(summaries))].items():
        k = v["median_kernels_to_target"]
        print(f"  {s:8s} kernels to {TARGET}: {'never' if k == math.inf else f'{k:g}':>5s}"
              f"  reached in {v['reached_frac']:.0%} of runs;  "
              f"{v['median_speedup_vs_exhaustive']:7.1f}x less time than exhaustive;  "
              f"final efficiency geomean {v['final_efficiency_geomean']:.4f}")
    for t in meta["targets"]:
        print(t)
    return 0


def _targets(summary: dict, title: str) -> list[str]:
    if "model" not in summary:
        return []
    m = summary["model"]
    k, speed = m["median_kernels_to_target"], m["median_speedup_vs_exhaustive"]
    return [f"{'PASS' if k <= TARGET_KERNELS else 'FAIL'} ({title}): model-guided median "
            f"kernels to {TARGET} of the oracle = {k:g} (target <= {TARGET_KERNELS})",
            f"{'PASS' if speed >= TARGET_SPEEDUP else 'FAIL'} ({title}): model-guided tuning "
            f"time {speed:.1f}x less than exhaustive (target >= {TARGET_SPEEDUP:g}x)"]


if __name__ == "__main__":
    sys.exit(main())
