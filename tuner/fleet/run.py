"""Running a fleet collection on this host: spawn the workers, export and report."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import sys
import time

import optuna
from optuna.trial import FrozenTrial, TrialState

from ...artifacts import write_atomic
from ...models import dataset
from ... import settings
from ...errors import UserError
from ...space.problem import GemmProblem
from ...space.suites import in_layouts
from ..measure.collect import configs_for, load_problems
from ..search.storage import open_storage, safe_url
from .plan import ITEM_ATTR, PLAN_ATTR, Plan, ROWS_ATTR, WORKER_ATTR, Work, plan_items
from .queue import decode_rows, prepare
from .worker import WorkerSpec, _worker_process

# ---------------------------------------------------------------- export and status
def export(study: optuna.Study, out: str) -> dict:
    """Append the rows of the study's COMPLETE trials that ``out`` lacks, as one part."""
    seen_items, rows, duplicates = set(), [], 0
    for t in sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)),
                    key=lambda t: t.number):
        item = t.user_attrs.get(ITEM_ATTR)
        if item in seen_items:
            duplicates += 1
            continue
        seen_items.add(item)
        rows += decode_rows(t.user_attrs[ROWS_ATTR])
    dataset.check_device(rows, dataset.device_names(out), out)
    have = dataset.done_keys(out)
    new = []
    for r in rows:
        k = dataset.row_key(r)
        if k not in have:
            have.add(k)
            new.append(r)
    dataset.append(out, new)
    return {"items": len(seen_items), "rows": len(rows), "appended": len(new),
            "duplicate_items": duplicates}


def status(study: optuna.Study) -> dict:
    """Planned items by the state of their live trial; lost: no WAITING, RUNNING or COMPLETE
    trial (retries exhausted or failed for good; the next collect enqueues them again)."""
    stored = study.user_attrs.get(PLAN_ATTR)
    if stored is None:
        raise ValueError(f"study {study.study_name!r} has no cutetune plan")
    plan = Plan.from_json(stored)
    best: dict[str, TrialState] = {}
    rank = {TrialState.COMPLETE: 3, TrialState.RUNNING: 2, TrialState.WAITING: 1}
    retried = 0
    for t in study.get_trials(deepcopy=False):
        retried += "failed_trial" in t.system_attrs
        item = t.user_attrs.get(ITEM_ATTR)
        if rank.get(t.state, 0) > rank.get(best.get(item), 0):
            best[item] = t.state
    counts = {"items": len(plan.items), "complete": 0, "running": 0, "waiting": 0, "lost": 0}
    for key in plan.items:
        s = best.get(key)
        counts[{TrialState.COMPLETE: "complete", TrialState.RUNNING: "running",
                TrialState.WAITING: "waiting"}.get(s, "lost")] += 1
    counts["retried"] = retried
    return counts


# ---------------------------------------------------------------- processes and CLI
def visible_gpus() -> list[str]:
    """CUDA_VISIBLE_DEVICES entries if set, else the indices of the devices torch sees."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def _spawn(target, specs: list) -> list[tuple[int, int]]:
    """Run ``target(spec)`` in one spawned process per spec; their (pid, exit code)."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=(s,)) for s in specs]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join()
    except KeyboardInterrupt:  # the workers' trials go stale and return to the queue
        for p in procs:
            p.terminate()
        raise
    return [(p.pid, p.exitcode) for p in procs]


def _run_pinned_child(job) -> None:
    fn, args, gpu = job
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    sys.exit(fn(args))


def run_pinned(fn, args) -> int:
    """Run ``fn(args)`` in ``args.workers`` processes, worker i pinned to visible GPU
    i mod count and given seed ``args.seed + i`` (for `cutetune tune --workers N`: the workers
    share one Optuna study, and one seed would make their samplers propose the same configs)."""
    import copy

    gpus = visible_gpus() or [None]
    jobs = []
    for i in range(args.workers):
        a = copy.copy(args)
        a.workers, a.seed = 1, args.seed + i
        jobs.append((fn, a, gpus[i % len(gpus)]))
    return max(1 if c < 0 else c for _, c in _spawn(_run_pinned_child, jobs))


def default_storage() -> str:
    path = settings.cache_dir() / "fleet.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def steady_rate(trials: list[FrozenTrial]) -> float | None:
    """Rows per minute between the first and the last item completed, leaving out the
    workers' start-up (imports, compile pools, first kernels) that ``rows_per_min`` includes."""
    done = sorted((t.datetime_complete.timestamp(), t.values[0]) for t in trials)
    if len(done) < 2 or done[-1][0] <= done[0][0]:
        return None
    return sum(v for _, v in done[1:]) / (done[-1][0] - done[0][0]) * 60


def run_fleet(args) -> int:
    """`cutetune collect` in fleet mode: plan or join, run the workers, export."""
    if args.backend != "gpu" and not args.backend.startswith("replay:"):
        raise ValueError(f"--backend must be 'gpu' or 'replay:PATH', got {args.backend!r}")
    url = args.storage or default_storage()
    if url.startswith("journal:"):
        raise UserError("a fleet queue needs sqlite:///FILE (one host) or postgresql://... "
                        "(many hosts), not a journal file")
    if args.backend == "gpu":  # a GPU is there: `cutetune collect` asked first
        gpus = visible_gpus()
    else:  # a damaged replayed dataset is named here, not in every worker's traceback
        dataset.load(args.backend[len("replay:"):], columns=["problem_key"])
        gpus = [None]
    n = args.workers if args.workers is not None else len(gpus)
    problems = load_problems(args.problems, args.dtype, args.arch, args.seed)[:args.limit_problems]
    if any(not isinstance(p, GemmProblem) for _, p in problems):
        raise UserError(f"a fleet measures dense GEMMs; {args.problems} holds grouped ones: "
                        "collect them on one host (without --storage)")
    spec_problems = args.problems + (f"[:{args.limit_problems}]" if args.limit_problems else "")
    if args.layouts is not None:
        problems = in_layouts(problems, args.layouts.split(","))
        spec_problems += f"@{args.layouts}"
    configs: str | tuple = args.configs
    if args.configs != "all" and not args.configs.startswith("sample:"):
        configs = tuple(configs_for(problems[0][1], args.configs, args.seed)) if problems else ()
    work_def = Work(spec_problems, args.arch, args.dtype, configs, args.seed, args.item_size)
    name = args.study or (f"collect:{spec_problems}:{args.configs}:{args.arch}:{args.dtype}:"
                          f"seed{args.seed}")
    storage = open_storage(url, args.heartbeat, args.max_retry)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t0 = time.time()
    study, plan, enqueued = prepare(
        storage, name, work_def, lambda: plan_items(problems, work_def, dataset.done_keys(args.out)))
    print(f"fleet: study {name!r} in {safe_url(url)}: {len(plan.items)} items planned, "
          f"{enqueued} enqueued now; {n} workers here", file=sys.stderr, flush=True)
    cache = settings.kernel_cache_dir(args.cache_dir)
    compile_workers = args.compile_workers or max(1, ((os.cpu_count() or 2) - 2) // n)
    specs = [WorkerSpec(url, name, args.backend, gpus[i % len(gpus)], args.heartbeat,
                        args.max_retry, t0 + args.time_budget, compile_workers, cache,
                        args.target_ms, args.replay_delay) for i in range(n)]
    procs = _spawn(_worker_process, specs)
    elapsed = time.time() - t0
    codes = [c for _, c in procs]
    names = {f"{socket.gethostname()}:{pid}" for pid, _ in procs}
    mine = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.user_attrs.get(WORKER_ATTR) in names
            and t.datetime_complete and t.datetime_complete.timestamp() >= t0]
    rows_here = int(sum(t.values[0] for t in mine))
    counts = status(study)
    exported = export(study, args.out)
    stats = {"study": name, "workers": n, "exit_codes": codes, "elapsed_s": elapsed,
             "items_here": len(mine), "rows_here": rows_here,
             "rows_per_min": rows_here / elapsed * 60,
             "steady_rows_per_min": steady_rate(mine), "study_status": counts,
             "exported": exported, "time_budget_s": args.time_budget}
    crashed = [c for c in codes if c != 0]
    print(f"fleet: {n} workers here ({len(crashed)} exited abnormally: {crashed}); this host "
          f"completed {len(mine)} items, {rows_here} rows in {elapsed:.0f} s "
          f"({stats['rows_per_min']:.0f} rows/min)", file=sys.stderr)
    print(f"fleet: study {counts}; exported {exported['appended']} new rows to {args.out}",
          file=sys.stderr)
    if args.stats:
        write_atomic(args.stats, json.dumps(stats, indent=1), "stats file")
    unfinished = counts["items"] - counts["complete"]
    if unfinished and time.time() - t0 < args.time_budget:
        print(f"fleet: {unfinished} items are not complete ({counts['lost']} lost); run the "
              f"command again to queue them", file=sys.stderr)
        return 1
    return 0
