"""`cutetune tune`: search one problem's configs with an Optuna study, on the GPU or replayed.

The study lives in an Optuna storage (a journal file under the cache folder by default), so a
run with the same study name resumes: every strategy reads what was already measured from
the trials' attributes and never measures a config twice. GPU measurements are also appended
to a cutetune dataset, so the cost model can be retrained on what tuning found.

``tune_study`` is the loop, shared with the replay benchmark (tuner/replay.py): ask the
sampler for a trial, decode it to a valid config, measure it (or reuse a measured one),
tell the result, until a budget is spent or the strategy stops.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState

from cutetune.space.config import KernelConfig
from cutetune.space.enumerate import enumerate_configs
from cutetune.space.problem import GemmProblem

from .compile import cache_dir
from .backends import BenchmarkBackend, GpuBackend, ReplayBackend
from .strategies import (ATTR_KEY, ATTR_STATUS, ATTR_TIME, STRATEGIES, ModelGuidedSampler,
                         ProposingSampler, RankedTimes, SpaceEncoding, make_sampler)

DEFAULT_TRIALS = {"model": 64, "tpe": 64, "random": 64, "cmaes": 64}
# A stochastic sampler that keeps proposing measured configs has converged; stop it after
# this many in a row (they cost nothing but never end).
MAX_REPEATS = 200
SPACE_ATTR = "cutetune_space"
_MODEL_DEFAULTS = ModelGuidedSampler.__init__.__kwdefaults__


def default_storage_url() -> str:
    return f"journal:{cache_dir() / 'studies.journal'}"


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """``journal:PATH`` for a journal file (safe for concurrent processes, no server), or any
    URL Optuna's RDB storage accepts (sqlite:///tune.db, postgresql://...)."""
    if url.startswith("journal:"):
        path = Path(url[len("journal:"):]).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
    return optuna.storages.RDBStorage(url)


@dataclass(frozen=True)
class Budget:
    """Limits on one tuning run (None: no limit). seconds counts charged compile and
    benchmark time (what the backend reports), not the sampler's own time."""

    trials: int | None = None
    kernels: int | None = None
    seconds: float | None = None


@dataclass(frozen=True)
class Step:
    """One trial of a run. new_kernel: its compile key was first built in this run;
    reused: the config was measured before (earlier in the study) and not measured again."""

    config: KernelConfig
    status: str
    time_ms: float | None
    compile_s: float
    bench_s: float
    new_kernel: bool
    reused: bool


@dataclass(frozen=True)
class TuneResult:
    problem: GemmProblem
    steps: tuple[Step, ...]
    stop_reason: str
    earlier: dict  # config_key -> time_ms of ok configs measured by earlier runs of the study

    @property
    def kernels(self) -> int:
        return sum(s.new_kernel for s in self.steps)

    @property
    def cost_s(self) -> float:
        return sum(s.compile_s + s.bench_s for s in self.steps)

    def best(self) -> tuple[str, float] | None:
        """(config_key, time_ms) of the fastest ok config in the study."""
        times = dict(self.earlier)
        times.update({s.config.short(): s.time_ms for s in self.steps if s.status == "ok"})
        return min(times.items(), key=lambda kv: kv[1]) if times else None


def _history(study: optuna.Study) -> dict[str, tuple[str, float | None]]:
    out = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        if ATTR_KEY in t.user_attrs:
            a = t.user_attrs
            out[a[ATTR_KEY]] = (a.get(ATTR_STATUS, ""), a.get(ATTR_TIME))
    return out


def _spent(budget: Budget, trials: int, kernels: int, seconds: float) -> str:
    if budget.trials is not None and trials >= budget.trials:
        return f"trial budget ({budget.trials}) spent"
    if budget.kernels is not None and kernels >= budget.kernels:
        return f"kernel budget ({budget.kernels}) spent"
    if budget.seconds is not None and seconds >= budget.seconds:
        return f"time budget ({budget.seconds:g} s) spent"
    return ""


def tune_study(study: optuna.Study, sampler: optuna.samplers.BaseSampler, problem: GemmProblem,
               encoding: SpaceEncoding, backend: BenchmarkBackend, budget: Budget,
               on_measure=None) -> TuneResult:
    """Run the tuning loop on ``study`` (whose sampler is ``sampler``) until a budget is spent
    or the strategy stops; ``on_measure(measurement)`` sees each new measurement."""
    memo = _history(study)
    earlier = {k: t for k, (s, t) in memo.items() if s == "ok"}
    built: set[KernelConfig] = set()
    steps: list[Step] = []
    repeats, cost = 0, 0.0
    while True:
        reason = _spent(budget, len(steps), len(built), cost)
        if reason:
            break
        if isinstance(sampler, ProposingSampler) and sampler.next_config(study) is None:
            reason = sampler.stop_reason
            break
        trial = study.ask(encoding.distributions())
        config = encoding.decode(trial.params)
        key = config.short()
        if key in memo:
            (status, time_ms), reused, compile_s, bench_s = memo[key], True, 0.0, 0.0
            repeats += 1
        else:
            m = backend.measure(problem, [config])[0]
            status, time_ms, compile_s, bench_s = m.status, m.time_ms, m.compile_s, m.bench_s
            reused = False
            memo[key] = (status, time_ms)
            repeats = 0
            if on_measure is not None:
                on_measure(m)
        new_kernel = not reused and config.compile_key() not in built
        if new_kernel:
            built.add(config.compile_key())
        cost += compile_s + bench_s
        for name, value in ((ATTR_KEY, key), (ATTR_STATUS, status), (ATTR_TIME, time_ms),
                            ("compile_s", compile_s), ("bench_s", bench_s), ("reused", reused)):
            trial.set_user_attr(name, value)
        ok = status == "ok" and time_ms is not None and math.isfinite(time_ms)
        if ok:
            study.tell(trial, time_ms)
        else:
            study.tell(trial, state=TrialState.FAIL)
        steps.append(Step(config, status, time_ms if ok else None, compile_s, bench_s,
                          new_kernel, reused))
        if repeats >= MAX_REPEATS:
            reason = f"the sampler proposed {MAX_REPEATS} measured configs in a row"
            break
    return TuneResult(problem, tuple(steps), reason, earlier)


def open_study(problem: GemmProblem, encoding: SpaceEncoding, sampler, storage, name: str):
    """Create or resume study ``name``; refuse to resume one built over another config space."""
    study = optuna.create_study(study_name=name, storage=storage, sampler=sampler,
                                direction="minimize", load_if_exists=True)
    fp = encoding.fingerprint()
    have = study.user_attrs.get(SPACE_ATTR)
    if have is None:
        study.set_user_attr(SPACE_ATTR, fp)
        study.set_user_attr("problem_key", problem.key())
    elif have != fp:
        raise ValueError(f"study {name!r} was created over a different set of configs; pass a "
                         f"new --study name")
    return study


# ---------------------------------------------------------------- CLI
def _gpu_backend() -> GpuBackend:
    try:
        from .gpu_session import measure_configs
    except ImportError as e:
        raise ValueError(f"the GPU backend is not available here ({e})") from None
    return GpuBackend(measure_configs)


def _backend(spec: str) -> tuple[str, BenchmarkBackend]:
    if spec == "gpu":
        return "gpu", _gpu_backend()
    if spec.startswith("replay:"):
        return "replay", ReplayBackend(spec[len("replay:"):])
    raise ValueError(f"--backend must be 'gpu' or 'replay:PATH', got {spec!r}")


def _scorer(args, problem: GemmProblem):
    try:
        from cutetune.models import load_model
    except ImportError as e:
        raise ValueError(f"the model strategy needs a trained cost model, and cutetune.models "
                         f"cannot load one here ({e})") from None
    return RankedTimes(load_model(args.model, arch=problem.arch, dtype=problem.dtype))


def run(args: argparse.Namespace) -> int:
    if args.workers > 1:  # several processes on one study: Optuna shares it through storage
        from .fleet import run_pinned

        return run_pinned(run, args)
    started = time.perf_counter()
    problem = GemmProblem(m=args.m, n=args.n, k=args.k, batch=args.batch, dtype=args.dtype,
                          out_dtype=args.out_dtype or args.dtype, a_major=args.a_major,
                          b_major=args.b_major, arch=args.arch)
    kind, backend = _backend(args.backend)
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
    study = open_study(problem, encoding, sampler, open_storage(args.storage), name)
    trials = args.trials if args.trials is not None else DEFAULT_TRIALS.get(args.strategy)
    budget = Budget(trials=trials, seconds=args.time_budget)
    new_rows: list[dict] = []
    on_measure = (lambda m: new_rows.append({**m.row, "suite": "tune"})) if kind == "gpu" else None
    cublas = None
    try:
        result = tune_study(study, sampler, problem, encoding, backend, budget, on_measure)
        if kind == "gpu":  # is the tuned kernel worth it over the library? same GPU, same timing
            from .gpu_session import measure_cublas
            cublas = measure_cublas(problem)
            new_rows.append(cublas)
    finally:
        if new_rows:
            from cutetune.dataset import append
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
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="processes tuning one study together; worker i pinned to visible GPU "
                        "i mod count, seeded --seed + i")
    p.add_argument("--trials", type=int, default=None,
                   help="most trials this run (default 64 for model/tpe/random/cmaes; "
                        "the whole list for exhaustive/quack44/nvmmh)")
    p.add_argument("--time-budget", type=float, default=None, metavar="S",
                   help="stop after S seconds of compile + benchmark time")
    p.add_argument("--storage", default=default_storage_url(),
                   help="Optuna storage: journal:PATH or an RDB URL (default %(default)s)")
    p.add_argument("--study", default=None,
                   help="study name (default cutetune:<problem>:<strategy>:<backend>); "
                        "an existing study resumes")
    p.add_argument("--backend", default="gpu", help="gpu, or replay:PATH to answer from a "
                   "recorded dataset on the CPU")
    p.add_argument("--dataset", default=str(cache_dir() / "tune_dataset"),
                   help="dataset folder that GPU measurements are appended to")
    p.add_argument("--model", default=None, help="cost model file (default: the packaged one)")
    p.add_argument("--margin", type=float, default=None,
                   help="model strategy: prune configs predicted more than this fraction "
                        f"slower than the best measured (default {_MODEL_DEFAULTS['margin']})")
    p.add_argument("--min-gain", type=float, default=None,
                   help="model strategy: stop when the expected relative gain is below this "
                        f"(default {_MODEL_DEFAULTS['min_gain']})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results", default=None, metavar="PATH",
                   help="append one JSON line with what this run found and cost")
    p.set_defaults(func=run)
