"""`cutetune predict`: rank kernel configs of one GEMM problem with a trained cost model: a dense
GEMM, or with ``--experts`` a grouped one (an MoE layer's expert GEMMs), ranked by the model of
its kind."""

from __future__ import annotations

import argparse
import json

from ..errors import UserError
from ..models.artifact import ModelError, load_model, shipped_model_path
from ..models.kinds import kind_of
from ..models.predict import read_configs
from ..space.device import device_for
from ..space.problem import GROUPED_GEMMS, GemmProblem, GroupedProblem, layout_name

DENSE_ONLY = {"batch": 1, "a_major": "k", "b_major": "k"}  # option -> its default


def _problem(args: argparse.Namespace) -> GemmProblem | GroupedProblem:
    """The problem the options describe; UserError for options of the other kind."""
    if args.experts is None:
        if args.gemm is not None:
            raise UserError("--gemm names a grouped GEMM: give --experts too")
        layout = {k: default if getattr(args, k) is None else getattr(args, k)
                  for k, default in DENSE_ONLY.items()}
        return GemmProblem(args.m, args.n, args.k, dtype=args.dtype, out_dtype=args.dtype,
                           arch=args.arch, **layout)
    given = ["--" + k.replace("_", "-") for k in DENSE_ONLY if getattr(args, k) is not None]
    if given:
        raise UserError(f"{', '.join(given)} describe dense GEMMs; a grouped GEMM's layout "
                        f"follows --gemm")
    return GroupedProblem(args.experts, args.m, args.n, args.k, gemm=args.gemm or "fwd",
                          dtype=args.dtype, out_dtype=args.dtype, arch=args.arch)


def _run(args: argparse.Namespace) -> int:
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {args.top_k}")
    problem = _problem(args)
    kind = kind_of(problem)
    if args.device is not None:
        if args.model:
            raise UserError("--device picks a shipped model, --model names one: give one")
        arch = device_for(args.device).arch  # ValueError naming the devices known
        if arch != problem.arch:
            raise UserError(f"--device {args.device} is an {arch} GPU, the problem {problem.arch}")
    model = load_model(args.model or shipped_model_path(problem.arch, problem.dtype, kind.name,
                                                        args.device),
                       problem.arch, problem.dtype, kind.name)
    configs = read_configs(args.configs, problem.arch) if args.configs else None
    ranked = model.scored(problem, configs, args.top_k)
    one_model = model.timer is model.ranker
    top1_ms = ranked[0][2]  # the fallback judges the top-1: no second ranking of the space
    try:
        margin = model.aten_margin(problem, configs, top1_ms)
    except ModelError:
        margin = None  # a model trained without ATen timings has no fallback
    measured = model.measured_layout(problem)
    prefers = None if margin is None else model.prefers_aten(problem, configs, top1_ms)
    # the baseline's name in the JSON keys: cublas (torch.mm) for dense GEMMs, aten
    # (torch._grouped_mm) for grouped ones
    base = kind.baseline_backend
    if args.json:
        print(json.dumps({
            "problem": problem.to_dict(), "ordered_by": model.ordering,
            "ranked": [{"rank": i + 1, "config": c.to_dict(), "config_key": c.short(),
                        "score": score, "predicted_ms": ms}
                       for i, (c, score, ms) in enumerate(ranked)],
            f"prefers_{base}": prefers, f"{base}_margin": margin,
            "layout_measured": measured}, indent=1))
        return 0
    print(f"{problem.key()}  ({problem.flops / 1e9:.3g} GFLOP)")
    # The rank is the ranker's; with a ranking objective the time model, a second model,
    # gives the ms, and may order near ties differently: the score column is what ranks.
    if one_model:
        print(f"ordered by predicted time ({model.ranker.objective} model)")
    else:
        print(f"ranked by the {model.ordering} model's score (lower is better); est. ms "
              f"is the time model's (it may order near ties differently)")
    print(f"{'rank':>4}  {'config':<32} {'score':>8} {'est. ms':>10} {'TFLOP/s':>8}")
    for i, (c, score, ms) in enumerate(ranked):
        print(f"{i + 1:>4}  {c.short():<32} {score:>8.3f} {ms:>10.4f} "
              f"{problem.flops / ms / 1e9:>8.1f}")
    if margin is not None:
        verdict = f"use {kind.baseline}" if margin > 0 else "use the top-1 config"
        print(f"fallback: {verdict} (margin {margin:+.3f}: > 0 runs {kind.baseline})")
    if not measured:
        print(f"the model's data has no problem of layout {layout_name(problem)!r}: predicted "
              f"mode runs {kind.baseline}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("predict", help="rank kernel configs of a GEMM with the cost model")
    p.add_argument("--m", type=int, required=True,
                   help="M; of a grouped fwd or dgrad GEMM, M_TOTAL: the routed rows")
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--k", type=int, required=True,
                   help="K; of a grouped wgrad GEMM, the routed rows")
    p.add_argument("--experts", type=int, metavar="E",
                   help="rank a grouped (MoE expert) GEMM of E experts, with the grouped model")
    p.add_argument("--gemm", choices=tuple(GROUPED_GEMMS),
                   help="which grouped GEMM (with --experts; default fwd): the forward, the "
                        "input gradient, or the weight gradient (varlen K)")
    p.add_argument("--batch", type=int, help="dense GEMMs only (default 1)")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--arch", default="sm90")
    p.add_argument("--a-major", help="dense GEMMs only: k (row-major A, the default) or m")
    p.add_argument("--b-major", help="dense GEMMs only: k (nn.Linear weight, the default) or n")
    p.add_argument("--top-k", type=int, default=10, help="how many configs to show")
    p.add_argument("--configs", metavar="FILE",
                   help="JSON list of configs (quack GemmConfig field names) to rank instead of "
                        "the whole valid space")
    p.add_argument("--device", metavar="GPU",
                   help="the GPU it runs on (H100, H200, or torch's name for it): the model "
                        "shipped for that GPU where one was measured on it (default: the "
                        "arch's, measured on an H200)")
    p.add_argument("--model", metavar="PATH",
                   help="model file (default: the shipped one of the problem's kind)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_run)
