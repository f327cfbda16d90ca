"""`cutetune tune`: search one problem's configs with an Optuna study, on the GPU or replayed
(``tuner/search/study.py``)."""

from __future__ import annotations

import argparse
import json
import time

import optuna

from ..space.enumerate import enumerate_configs
from ..space.problem import GemmProblem
from ..tuner.search.backends import BenchmarkBackend, GpuBackend, ReplayBackend
from ..tuner.search.samplers import STRATEGIES, RankedTimes, SpaceEncoding, make_sampler
from ..tuner.search.storage import GRACE_HEARTBEATS, open_storage
from ..tuner.search.study import (_MODEL_DEFAULTS, DEFAULT_TRIALS, Budget, TuneResult,
                                  default_storage_url, open_study, tune_study)
from .. import settings
from ..artifacts import check_writable, check_writable_dir
from .options import at_least, more_than


def _gpu_backend() -> GpuBackend:
    try:
        from ..tuner.measure.gpu_session import measure_configs
    except ImportError as e:
        raise ValueError(f"the GPU backend is not available here ({e})") from None
    return GpuBackend(measure_configs)


def _backend(spec: str, replay_delay: float) -> tuple[str, BenchmarkBackend]:
    if spec == "gpu":
        return "gpu", _gpu_backend()
    if spec.startswith("replay:"):
        return "replay", ReplayBackend(spec[len("replay:"):], delay_s=replay_delay)
    raise ValueError(f"--backend must be 'gpu' or 'replay:PATH', got {spec!r}")


def _scorer(args, problem: GemmProblem):
    try:
        from ..models import load_model, shipped_model_path
    except ImportError as e:
        raise ValueError(f"the model strategy needs a trained cost model, and cutetune.models "
                         f"cannot load one here ({e})") from None
    path = args.model
    if path is None and args.backend == "gpu":  # the model shipped for the GPU that measures
        from ..tuner.kernels.problems import cuda_device_name

        path = shipped_model_path(problem.arch, problem.dtype, device=cuda_device_name())
    return RankedTimes(load_model(path, arch=problem.arch, dtype=problem.dtype))


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    # What can be refused is refused here, once, before any worker process starts.
    problem = GemmProblem(m=args.m, n=args.n, k=args.k, batch=args.batch, dtype=args.dtype,
                          out_dtype=args.out_dtype or args.dtype, a_major=args.a_major,
                          b_major=args.b_major, arch=args.arch)
    # A trial whose process died is failed, not retried: the strategy decides again.
    storage = open_storage(args.storage, heartbeat_s=args.heartbeat, max_retry=0)
    if args.backend == "gpu":
        from ..tuner.measure.timing import require_gpu

        require_gpu()
        check_writable_dir(args.dataset, "dataset folder")  # where the measurements go
    if args.results:  # written when the run ends: a bad place is refused before it starts
        check_writable(args.results, "results file")
    if args.workers > 1:  # several processes on one study: Optuna shares it through storage
        from ..tuner.fleet.run import run_pinned

        return run_pinned(run, args)
    kind, backend = _backend(args.backend, args.replay_delay)
    candidates = enumerate_configs(problem.arch, problem)
    if kind == "replay":
        recorded = {c.short() for c in backend.configs(problem)}
        if not recorded:
            raise ValueError(f"the replayed dataset has no measurements of {problem.key()} "
                             f"({len(backend.problems())} problems recorded)")
        candidates = [c for c in candidates if c.short() in recorded]
    encoding = SpaceEncoding(candidates)
    scorer = _scorer(args, problem) if args.strategy == "model" else None
    model_options = {k: v for k, v in (("margin", args.margin), ("min_gain", args.min_gain))
                     if v is not None}
    if model_options and args.strategy != "model":
        raise ValueError("--margin and --min-gain apply to --strategy model only")
    sampler = make_sampler(args.strategy, problem, encoding, seed=args.seed, scorer=scorer,
                           **model_options)
    name = args.study or f"cutetune:{problem.key()}:{args.strategy}:{kind}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = open_study(problem, encoding, sampler, storage, name)
    trials = args.trials if args.trials is not None else DEFAULT_TRIALS.get(args.strategy)
    budget = Budget(trials=trials, seconds=args.time_budget)
    new_rows: list[dict] = []
    on_measure = (lambda m: new_rows.append({**m.row, "suite": "tune"})) if kind == "gpu" else None
    cublas = None
    try:
        result = tune_study(study, sampler, problem, encoding, backend, budget, on_measure)
        if kind == "gpu":  # is the tuned kernel worth it over the library? same GPU, same timing
            from ..tuner.measure.gpu_session import measure_cublas
            cublas = measure_cublas(problem)
            new_rows.append(cublas)
    finally:
        if new_rows:
            from ..models.dataset import append
            append(args.dataset, new_rows)
    record = _result_record(result, args, name, kind, cublas, time.perf_counter() - started)
    _print_result(record, args, len(candidates), len(result.earlier), len(new_rows), cublas)
    if args.results:
        with open(args.results, "a") as f:
            f.write(json.dumps(record) + "\n")
    return 0


def _result_record(r: TuneResult, args, name: str, kind: str, cublas: dict | None,
                   wall_s: float) -> dict:
    """One JSON line of what a run found and what it cost (``--results``)."""
    best = r.best()
    cublas_ms = cublas["time_ms"] if cublas and cublas["status"] == "ok" else None
    return {
        "problem_key": r.problem.key(), "problem": r.problem.to_dict(), "study": name,
        "strategy": args.strategy, "backend": kind, "model": args.model or "packaged",
        "best_config": best[0] if best else None, "best_ms": best[1] if best else None,
        "cublas_ms": cublas_ms,
        "speedup_vs_cublas": cublas_ms / best[1] if best and cublas_ms else None,
        "trials": len(r.steps), "measured": sum(not s.reused for s in r.steps),
        "kernels": r.kernels, "failed": sum(s.status != "ok" and not s.reused for s in r.steps),
        "compile_s": sum(s.compile_s for s in r.steps),
        "bench_s": sum(s.bench_s for s in r.steps),
        "wall_s": wall_s, "stop_reason": r.stop_reason,
        "configs_in_order": [s.config.short() for s in r.steps if not s.reused],
        "times_ms_in_order": [s.time_ms for s in r.steps if not s.reused],
        "timestamp": time.time(),
    }


def _print_result(rec: dict, args, n_candidates: int, n_earlier: int, appended: int,
                  cublas: dict | None):
    """The run's record (``_result_record``) for a person."""
    charged = "estimated from recorded costs" if rec["backend"] == "replay" else "measured"
    print(f"problem   {rec['problem_key']}  ({n_candidates} valid configs)")
    print(f"study     {rec['study']}  [{rec['strategy']}, {rec['backend']}]  "
          f"{n_earlier} ok configs from earlier runs")
    print(f"this run  {rec['measured']} configs measured, {rec['kernels']} kernels built; "
          f"{rec['compile_s']:.1f} s compile + {rec['bench_s']:.1f} s benchmark ({charged})")
    print(f"stopped   {rec['stop_reason']}")
    if rec["failed"]:
        print(f"failed    {rec['failed']} configs (see the study's trials)")
    if appended:
        print(f"dataset   {appended} rows appended to {args.dataset}")
    if rec["best_config"] is None:
        print("best      none: no config ran ok")
    else:
        print(f"best      {rec['best_config']}  {rec['best_ms']:.4f} ms")
    if cublas is not None:
        if cublas["status"] != "ok":
            print(f"cuBLAS    {cublas['status']}: {cublas.get('error', '')}")
        else:
            gain = (f"; best is {rec['speedup_vs_cublas']:.3f}x cuBLAS's speed"
                    if rec["best_ms"] else "")
            print(f"cuBLAS    {cublas['time_ms']:.4f} ms{gain}")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "tune", help="tune one GEMM problem with an Optuna study (model-guided or a baseline)",
        description=__doc__.split("\n\n")[0])
    for dim in ("m", "n", "k"):
        p.add_argument(f"--{dim}", type=int, required=True)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--out-dtype", default=None, help="default: --dtype")
    p.add_argument("--a-major", default="k", choices=("k", "m"))
    p.add_argument("--b-major", default="k", choices=("k", "n"))
    p.add_argument("--arch", default="sm90")
    p.add_argument("--strategy", default="model", choices=STRATEGIES)
    p.add_argument("--workers", action=at_least(1), default=1, metavar="N",
                   help="processes tuning one study together; worker i pinned to visible GPU "
                        "i mod count, seeded --seed + i")
    p.add_argument("--trials", action=at_least(1), default=None,
                   help="most trials this run (default 64 for model/tpe/random/cmaes; "
                        "the whole list for exhaustive/quack44/nvmmh)")
    p.add_argument("--time-budget", action=more_than(0), default=None, metavar="S",
                   help="stop after S seconds of compile + benchmark time")
    p.add_argument("--storage", default=default_storage_url(),
                   help="Optuna storage: journal:PATH, sqlite:///FILE or postgresql://... "
                        "(default %(default)s)")
    p.add_argument("--heartbeat", action=at_least(1), default=5, metavar="S",
                   help=f"seconds between heartbeats of the trial being measured; a trial "
                        f"whose process missed {GRACE_HEARTBEATS} is failed, and its config "
                        f"can be measured again (default %(default)s)")
    p.add_argument("--study", default=None,
                   help="study name (default cutetune:<problem>:<strategy>:<backend>); "
                        "an existing study resumes")
    p.add_argument("--backend", default="gpu", help="gpu, or replay:PATH to answer from a "
                   "recorded dataset on the CPU")
    p.add_argument("--replay-delay", action=at_least(0, float), default=0.0, metavar="S",
                   help="replay backend: seconds each measurement takes (stands in for the GPU)")
    p.add_argument("--dataset", default=str(settings.cache_dir() / "tune_dataset"),
                   help="dataset folder that GPU measurements are appended to")
    p.add_argument("--model", default=None, help="cost model file (default: the packaged one)")
    p.add_argument("--margin", action=at_least(0, float), default=None,
                   help="model strategy: prune configs predicted more than this fraction "
                        f"slower than the best measured (default {_MODEL_DEFAULTS['margin']})")
    p.add_argument("--min-gain", action=at_least(0, float), default=None,
                   help="model strategy: stop when the expected relative gain is below this "
                        f"(default {_MODEL_DEFAULTS['min_gain']})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results", default=None, metavar="PATH",
                   help="append one JSON line with what this run found and cost")
    p.set_defaults(func=run)
