"""`cutetune predict`: rank kernel configs of one GEMM problem with a trained cost model."""

from __future__ import annotations

import argparse
import json

from ..models.artifact import ModelError, load_model
from ..models.predict import read_configs
from ..space.problem import GemmProblem


def _run(args: argparse.Namespace) -> int:
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {args.top_k}")
    problem = GemmProblem(args.m, args.n, args.k, batch=args.batch, dtype=args.dtype,
                          out_dtype=args.dtype, a_major=args.a_major, b_major=args.b_major,
                          arch=args.arch)
    model = load_model(args.model, problem.arch, problem.dtype)
    configs = read_configs(args.configs, problem.arch) if args.configs else None
    ranked = model.scored(problem, configs, args.top_k)
    one_model = model.timer is model.ranker
    try:
        margin = model.cublas_margin(problem, configs)
    except ModelError:
        margin = None  # a model trained without cuBLAS timings has no fallback
    if args.json:
        print(json.dumps({
            "problem": problem.to_dict(), "ordered_by": model.ranker.objective,
            "ranked": [{"rank": i + 1, "config": c.to_dict(), "config_key": c.short(),
                        "score": score, "predicted_ms": ms}
                       for i, (c, score, ms) in enumerate(ranked)],
            "prefers_cublas": None if margin is None else margin > 0,
            "cublas_margin": margin}, indent=1))
        return 0
    print(f"{problem.key()}  ({problem.flops / 1e9:.3g} GFLOP)")
    # The rank is the ranker's; with a ranking objective the time model, a second model,
    # gives the ms, and may order near ties differently: the score column is what ranks.
    if one_model:
        print(f"ordered by predicted time ({model.ranker.objective} model)")
    else:
        print(f"ranked by the {model.ranker.objective} model's score (lower is better); est. ms "
              f"is the time model's (it may order near ties differently)")
    print(f"{'rank':>4}  {'config':<32} {'score':>8} {'est. ms':>10} {'TFLOP/s':>8}")
    for i, (c, score, ms) in enumerate(ranked):
        print(f"{i + 1:>4}  {c.short():<32} {score:>8.3f} {ms:>10.4f} "
              f"{problem.flops / ms / 1e9:>8.1f}")
    if margin is not None:
        verdict = "use cuBLAS" if margin > 0 else "use the top-1 config"
        print(f"fallback: {verdict} (quantile of log(t_top1/t_cuBLAS) = {margin:+.3f})")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("predict", help="rank kernel configs of a GEMM with the cost model")
    p.add_argument("--m", type=int, required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--arch", default="sm90")
    p.add_argument("--a-major", default="k", help="k (row-major A) or m")
    p.add_argument("--b-major", default="k", help="k (nn.Linear weight) or n")
    p.add_argument("--top-k", type=int, default=10, help="how many configs to show")
    p.add_argument("--configs", metavar="FILE",
                   help="JSON list of configs (quack GemmConfig field names) to rank instead of "
                        "the whole valid space")
    p.add_argument("--model", metavar="PATH", help="model file (default: the shipped one)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_run)
