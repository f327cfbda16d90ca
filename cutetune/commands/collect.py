"""`cutetune collect`: measure problems x configs on the GPU into a dataset, on this host or as
a fleet sharing one queue (``tuner/measure/collect.py``, ``tuner/fleet/``)."""

from __future__ import annotations

from ..artifacts import check_writable, check_writable_dir
from ..space.suites import LAYOUTS, ROUTINGS, check_layouts, check_routings, in_layouts
from .. import settings
from ..tuner.measure.collect import check_configs_spec, collect, load_problems
from ..tuner.measure.timing import TimingPolicy, require_gpu
from ..tuner.measure.collect import __doc__ as DOC
from .options import at_least, more_than
from . import fleet as fleet_cli


def register(sub) -> None:
    p = sub.add_parser("collect", help="measure problems x configs on the GPU into a dataset",
                       description=DOC)
    p.add_argument("--problems", default="train",
                   help="suite (llm, random, train, exhaustive, bmm, moe, moe_large, moe_random; 'a+b' "
                        "joins) or a JSON file")
    p.add_argument("--configs", default="sample:150",
                   help="'all' valid configs; 'sample:N' per problem (a problem with N measured "
                   "is done); 'sample:N@K' the same from K kernels per layout and dtype, so "
                   "that a fresh machine compiles K before it measures at GPU speed; or a "
                   "JSON file of configs")
    p.add_argument("--out", default="data/inputs/h200_bf16",
                   help="dataset folder (appended, resumable)")
    p.add_argument("--arch", default="sm90", choices=("sm90", "sm100"))
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit-problems", action=at_least(1), default=None, metavar="N",
                   help="only the first N problems of the suite")
    p.add_argument("--time-budget", action=more_than(0), default=1e9, metavar="S",
                   help="stop handing out new work after S seconds (resume later)")
    p.add_argument("--compile-workers", action=at_least(1), default=None)
    p.add_argument("--cache-dir", default=None, help="quack kernel cache (QUACK_CACHE_DIR)")
    p.add_argument("--target-ms", action=more_than(0), default=TimingPolicy.target_ms,
                   help="timed GPU milliseconds per measurement (sets the repeats)")
    p.add_argument("--stats", default=None, help="write throughput stats JSON here")
    p.add_argument("--layouts", default=None, metavar="L1,L2",
                   help=f"dense problems: measure each layer's GEMM of these operand majors, "
                        f"A's then B's ({', '.join(LAYOUTS)}: kn its input gradient, mn its "
                        f"weight gradient; default: as the suite gives them, kk)")
    p.add_argument("--routings", default=None, metavar="R1,R2",
                   help="grouped problems: measure each under these routings of its rows "
                        f"({', '.join(ROUTINGS)}; default: one drawn per problem by --seed)")
    fleet_cli.add_arguments(p)
    p.set_defaults(func=_run)


def _run(args) -> int:
    # What is wrong with the command itself, then the GPU, then where results go: refused
    # before anything is written or measured (a fleet writes the dataset at its export).
    fleet = fleet_cli.requested(args)
    routings = None if args.routings is None else check_routings(args.routings.split(","))
    if args.layouts is not None:  # named alike for a fleet
        args.layouts = ",".join(check_layouts(args.layouts.split(",")))
    check_configs_spec(args.configs)
    if not fleet or args.backend == "gpu":
        require_gpu()
    check_writable_dir(args.out, "dataset folder")
    if args.stats:
        check_writable(args.stats, "stats file")
    settings.kernel_cache_dir(args.cache_dir)  # --cache-dir, or the settings' folder
    if fleet:
        if routings is not None:
            raise ValueError("--routings is for grouped problems, which a fleet does not "
                             "measure: collect them on one host (without --storage)")
        from ..tuner.fleet.run import run_fleet

        return run_fleet(args)
    problems = load_problems(args.problems, args.dtype, args.arch, args.seed)[:args.limit_problems]
    if args.layouts is not None:
        problems = in_layouts(problems, args.layouts.split(","))
    collect(problems, args.configs, args.out, seed=args.seed, time_budget_s=args.time_budget,
            compile_workers=args.compile_workers, cache_dir=args.cache_dir,
            policy=TimingPolicy(target_ms=args.target_ms), stats_path=args.stats,
            routings=routings)
    return 0
