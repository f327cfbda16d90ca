"""Fleet collection: any number of GPU workers on any number of hosts share one queue of work
in an Optuna RDB storage (PostgreSQL across hosts, SQLite on one host).

The first ``cutetune collect --storage URL`` plans the work (problems x configs, in items of
at most ``--item-size`` configs, skipping what its ``--out`` already holds), stores the plan
in the study in one write, and enqueues one WAITING trial per item. Every other host runs the
same command and joins. A worker claims a WAITING trial with the storage's row-locked
WAITING -> RUNNING transition (the one ``Study.ask`` uses; ``ask`` itself would create a fresh
trial when the queue is empty), measures the item, stores its rows on the trial and marks it
COMPLETE. A worker that dies stops its heartbeat: after the grace period any live worker fails
the trial and Optuna's retry callback enqueues it again, so nothing is lost, and a result told
for a trial that was failed meanwhile is dropped, so nothing is recorded twice. Planning,
re-enqueueing and the stale-trial sweep run under a per-study lock (a PostgreSQL advisory
lock, or a file lock next to an SQLite file), so two hosts never enqueue one item twice.

Rows live on the trial as a user attribute (zlib-compressed JSON, about 100 bytes a row):
they are written in the same trial life cycle that decides completeness, need no schema of
their own, and workers never read them (a claim reads WAITING trials only). ``export`` turns
the COMPLETE trials into a cutetune dataset.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import multiprocessing as mp
import os
import random
import socket
import sys
import threading
import time
import warnings
import zlib
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import optuna
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from cutetune import dataset
from cutetune.space.config import KernelConfig
from cutetune.space.problem import GemmProblem

from .collect import CHUNK, configs_for, load_problems
from .compile import kernel_cache_dir
from .executor import Done, GpuExecutor
from .measure import TimingPolicy

PLAN_ATTR = "cutetune_plan"
ITEM_ATTR, ROWS_ATTR, WORKER_ATTR, ERROR_ATTR = "item", "rows_z", "worker", "error"
PLAN_VERSION = 1
GRACE_HEARTBEATS = 3  # a trial is stale after this many missed heartbeats


# ---------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Work:
    """What a study measures; every item resolves its configs through ``candidates``.

    configs is 'all' or 'sample:N' (resolved per problem with the seed), or the config list
    of a JSON file, stored in the plan so that hosts without the file can run its items.
    """

    problems: str
    arch: str
    dtype: str
    configs: str | tuple[KernelConfig, ...]
    seed: int
    item_size: int

    def candidates(self, problem: GemmProblem) -> list[KernelConfig]:
        if isinstance(self.configs, str):
            return configs_for(problem, self.configs, self.seed)
        return list(self.configs)

    def to_dict(self) -> dict:
        cfg = self.configs if isinstance(self.configs, str) else [c.to_dict() for c in self.configs]
        return {"problems": self.problems, "arch": self.arch, "dtype": self.dtype,
                "configs": cfg, "seed": self.seed, "item_size": self.item_size}

    @classmethod
    def from_dict(cls, d: dict) -> "Work":
        cfg = d["configs"]
        cfg = cfg if isinstance(cfg, str) else tuple(KernelConfig.from_dict(c) for c in cfg)
        return cls(d["problems"], d["arch"], d["dtype"], cfg, int(d["seed"]), int(d["item_size"]))


@dataclass(frozen=True)
class WorkItem:
    """Some configs of one problem (indices into ``Work.candidates``, whose digest at planning
    is ``space``), and maybe its cuBLAS row."""

    key: str
    suite: str
    problem: GemmProblem
    indices: tuple[int, ...]
    cublas: bool
    space: str

    def to_json(self) -> list:
        return [self.key, self.suite, self.problem.to_dict(), _ranges(self.indices), self.cublas,
                self.space]

    @classmethod
    def from_json(cls, v: list) -> "WorkItem":
        key, suite, problem, ranges, cublas, space = v
        return cls(key, suite, GemmProblem(**problem),
                   tuple(i for a, b in ranges for i in range(a, b)), bool(cublas), space)


def space_digest(configs: list[KernelConfig]) -> str:
    return hashlib.sha256("|".join(c.short() for c in configs).encode()).hexdigest()[:12]


def _ranges(indices: tuple[int, ...]) -> list[list[int]]:
    """Sorted indices as [start, stop) runs: a plan of thousands of items stays small."""
    out: list[list[int]] = []
    for i in indices:
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return out


@dataclass(frozen=True)
class Plan:
    work: Work
    items: dict[str, WorkItem]
    _candidates: dict = field(default_factory=dict, compare=False, repr=False)

    def configs(self, item: WorkItem) -> list[KernelConfig]:
        """The item's configs; ValueError if this host enumerates another config space than
        the planning host did (another cutetune version), so indices would mean other configs."""
        p = item.problem
        if p not in self._candidates:
            if len(self._candidates) >= 64:  # bounded: 'all' is thousands of configs each
                self._candidates.clear()
            cands = self.work.candidates(p)
            self._candidates[p] = (cands, space_digest(cands))
        cands, digest = self._candidates[p]
        if digest != item.space:
            raise ValueError(f"item {item.key}: this host's configs for the problem differ from "
                             f"the planning host's (another cutetune version?)")
        return [cands[i] for i in item.indices]

    def to_json(self) -> str:
        return json.dumps({"version": PLAN_VERSION, "work": self.work.to_dict(),
                           "items": [it.to_json() for it in self.items.values()]})

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        d = json.loads(text)
        if d.get("version") != PLAN_VERSION:
            raise ValueError(f"the study's plan has version {d.get('version')}; this cutetune "
                             f"reads version {PLAN_VERSION}")
        items = [WorkItem.from_json(v) for v in d["items"]]
        return cls(Work.from_dict(d["work"]), {it.key: it for it in items})


def plan_items(problems: list[tuple[str, GemmProblem]], work: Work,
               done: set[tuple]) -> list[WorkItem]:
    """Items covering every (problem, config) and cuBLAS baseline not in ``done``; the cuBLAS
    row rides with a problem's first item."""
    items, seen = [], set()
    for suite, p in problems:
        if p in seen:
            continue
        seen.add(p)
        pk, cands = p.key(), work.candidates(p)
        todo = [i for i, c in enumerate(cands) if (pk, "quack", c.short()) not in done]
        cublas = (pk, "cublas", "") not in done
        chunks = [todo[i:i + work.item_size] for i in range(0, len(todo), work.item_size)]
        for j, chunk in enumerate(chunks or ([[]] if cublas else [])):
            items.append(WorkItem(f"{pk}#{j}", suite, p, tuple(chunk), cublas and j == 0,
                                  space_digest(cands)))
    return items


# ---------------------------------------------------------------- storage
def open_storage(url: str, heartbeat_s: int = 20, max_retry: int = 3) -> optuna.storages.RDBStorage:
    """An RDB storage whose RUNNING trials are failed and re-enqueued (at most ``max_retry``
    times) once their heartbeat is GRACE_HEARTBEATS intervals old."""
    if url.startswith("postgresql://"):
        # SQLAlchemy 2.0 maps a bare postgresql:// to psycopg2, 2.1 to psycopg (3): pin the
        # one the `fleet` extra installs.
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    dialect = url.split(":", 1)[0].split("+", 1)[0]
    if dialect not in ("postgresql", "sqlite"):
        raise ValueError(f"--storage must be postgresql://... (many hosts) or sqlite:///FILE "
                         f"(one host), got a {dialect!r} URL")
    kwargs = ({"connect_args": {"timeout": 60}} if dialect == "sqlite" else
              {"pool_pre_ping": True, "connect_args": {"connect_timeout": 10}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        try:
            storage = optuna.storages.RDBStorage(
                url, engine_kwargs=kwargs, heartbeat_interval=heartbeat_s,
                grace_period=GRACE_HEARTBEATS * heartbeat_s,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                    max_retry=max_retry))
        except ImportError:
            raise ValueError("a PostgreSQL storage needs the psycopg driver: "
                             "pip install 'cutetune[fleet]'") from None
        except Exception as e:  # sqlalchemy/psycopg raise many types for a bad server or URL
            raise ValueError(f"cannot open storage {_safe_url(url)}: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}") from None
    if dialect == "sqlite":
        # Write-ahead log, synced at checkpoints: a commit costs no fsync, and readers do not
        # block the writer (a trial takes about six commits).
        from sqlalchemy import event

        @event.listens_for(storage.engine, "connect")
        def _pragmas(conn, _record):
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")

        storage.engine.dispose()  # connections opened so far lack the pragmas
    return storage


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparsable URL>"


@contextmanager
def study_lock(storage: optuna.storages.RDBStorage, name: str):
    """Serialize planning, enqueueing and the stale sweep of one study across processes and
    hosts: a PostgreSQL session advisory lock (released if the holder dies), or an exclusive
    file lock beside an SQLite file."""
    engine = storage.engine
    if engine.dialect.name == "postgresql":
        from sqlalchemy import text

        key = int.from_bytes(hashlib.sha256(f"cutetune:{name}".encode()).digest()[:8], "big",
                             signed=True)
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
        return
    db = engine.url.database
    if not db or db == ":memory:":  # one process owns an in-memory database
        yield
        return
    with open(f"{db}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _study(storage, name: str, create: bool) -> optuna.Study:
    sampler = optuna.samplers.RandomSampler()  # never asked: trials come from the queue
    if create:
        return optuna.create_study(study_name=name, storage=storage, sampler=sampler,
                                   direction="minimize", load_if_exists=True)
    try:
        return optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    except KeyError:
        raise ValueError(f"no study {name!r} in this storage") from None


def prepare(storage, name: str, work: Work, plan_fn) -> tuple[optuna.Study, Plan, int]:
    """Create or join study ``name``: store the plan ``plan_fn()`` if the study has none
    (refusing a study planned for other work), then enqueue every planned item that has no
    WAITING, RUNNING or COMPLETE trial. Returns (study, plan, items enqueued now)."""
    with study_lock(storage, name):
        study = _study(storage, name, create=True)
        stored = study.user_attrs.get(PLAN_ATTR)
        if stored is None:
            plan = Plan(work, {it.key: it for it in plan_fn()})
            study.set_user_attr(PLAN_ATTR, plan.to_json())
        else:
            plan = Plan.from_json(stored)
            if plan.work != work:
                raise ValueError(f"study {name!r} was planned for other work "
                                 f"({json.dumps(plan.work.to_dict())[:300]}); pass another "
                                 f"--study or the same collect arguments")
        return study, plan, _enqueue_missing(study, plan)


def _enqueue_missing(study: optuna.Study, plan: Plan) -> int:
    live = {t.user_attrs.get(ITEM_ATTR) for t in study.get_trials(
        deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE))}
    missing = [k for k in plan.items if k not in live]
    for key in missing:
        study.enqueue_trial({}, user_attrs={ITEM_ATTR: key})
    return len(missing)


class Claimer:
    """Takes WAITING trials of one study (RUNNING from then on).

    Reading the queue loads every WAITING trial, so a worker keeps the list it read and picks
    from it at random (workers rarely pick the same trial), reading again only when a pick was
    taken by someone else or the list ran out. A trial's heartbeat is recorded before it is
    claimed, so a worker that dies right after claiming still leaves a trial that goes stale
    (a RUNNING trial without a heartbeat never does). PostgreSQL row-locks the
    WAITING -> RUNNING update; SQLite ignores that lock (two processes could both claim one
    trial), so there claims take the study lock.
    """

    def __init__(self, storage, name: str):
        self.storage, self.name = storage, name
        self.study_id = storage.get_study_id_from_name(name)
        self.serial = storage.engine.dialect.name == "sqlite"
        self.candidates: list[FrozenTrial] = []
        self.rng = random.Random(os.getpid())

    def __call__(self) -> tuple[int, FrozenTrial] | None:
        """(trial id, trial) of a newly claimed trial, or None if none is waiting."""
        with study_lock(self.storage, self.name) if self.serial else nullcontext():
            fresh = False
            while True:
                if not self.candidates:
                    if fresh:
                        return None
                    self.candidates = self.storage.get_all_trials(
                        self.study_id, deepcopy=False, states=(TrialState.WAITING,))
                    fresh = True
                    continue
                t = self.candidates.pop(self.rng.randrange(len(self.candidates)))
                tid = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, t.number)
                self.storage.record_heartbeat(tid)
                try:
                    if self.storage.set_trial_state_values(tid, state=TrialState.RUNNING):
                        return tid, t
                except UpdateFinishedTrialError:
                    pass
                self.candidates, fresh = [], False  # taken meanwhile: the list is stale


def encode_rows(rows: list[dict]) -> str:
    return base64.b64encode(zlib.compress(json.dumps(rows).encode(), 6)).decode()


def decode_rows(text: str) -> list[dict]:
    return json.loads(zlib.decompress(base64.b64decode(text)))


# ---------------------------------------------------------------- executors
class Executor(Protocol):
    def room(self) -> bool: ...
    def submit(self, trial_id: int, item: WorkItem, configs: list[KernelConfig]) -> None: ...
    def poll(self, timeout: float) -> list[Done]: ...
    def close(self) -> None: ...


class ReplayExecutor:
    """Answers an item with the rows a recorded dataset holds for it, exactly as recorded,
    after ``delay_s`` (standing in for the GPU time): CI runs the fleet on real measurements
    without a GPU. An item the dataset lacks fails; nothing is made up."""

    def __init__(self, path: str, problem_keys: set[str], delay_s: float = 0.0):
        import pyarrow as pa
        import pyarrow.compute as pc

        table = dataset.load(path)
        table = table.filter(pc.is_in(table.column("problem_key"), pa.array(sorted(problem_keys))))
        self.rows = {tuple(r[c] for c in dataset.KEY_COLUMNS): r for r in table.to_pylist()}
        self.delay_s = delay_s
        self.current: tuple[int, WorkItem, list[KernelConfig], float] | None = None

    def room(self) -> bool:
        return self.current is None

    def submit(self, trial_id, item, configs) -> None:
        self.current = (trial_id, item, configs, time.monotonic() + self.delay_s)

    def poll(self, timeout: float) -> list[Done]:
        if self.current is None:
            return []
        tid, item, configs, ready = self.current
        wait = ready - time.monotonic()
        if wait > timeout:
            time.sleep(timeout)
            return []
        time.sleep(max(wait, 0.0))
        self.current = None
        pk = item.problem.key()
        keys = [(pk, "quack", c.short()) for c in configs]
        keys = [(pk, "cublas", "")] + keys if item.cublas else keys
        missing = [k for k in keys if k not in self.rows]
        if missing:
            return [Done(tid, [], f"replay: the dataset has no row for {missing[0]} "
                                  f"(and {len(missing) - 1} more)")]
        return [Done(tid, [self.rows[k] for k in keys])]

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- the worker
@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker process needs (picklable: workers are spawned)."""

    storage: str
    study: str
    backend: str  # "gpu" or "replay:PATH"
    gpu: str | None = None  # CUDA_VISIBLE_DEVICES of this worker
    heartbeat_s: int = 20
    max_retry: int = 3
    deadline: float = float("inf")  # time.time() after which no item is claimed
    compile_workers: int = 1
    cache_dir: str = ""
    target_ms: float = TimingPolicy.target_ms
    replay_delay_s: float = 0.0


class _Heartbeat(threading.Thread):
    def __init__(self, storage, held: dict, interval: float):
        super().__init__(daemon=True)
        self.storage, self.held, self.interval = storage, held, interval
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            for tid in list(self.held):
                try:
                    self.storage.record_heartbeat(tid)
                except Exception as e:  # a database hiccup: the next beat may succeed
                    print(f"fleet: heartbeat of trial {tid} failed: {e}", file=sys.stderr)


def _executor(spec: WorkerSpec, plan: Plan) -> Executor:
    if spec.backend.startswith("replay:"):
        keys = {it.problem.key() for it in plan.items.values()}
        return ReplayExecutor(spec.backend[len("replay:"):], keys, spec.replay_delay_s)
    return GpuExecutor(plan.work.arch, spec.cache_dir, spec.compile_workers,
                       TimingPolicy(target_ms=spec.target_ms))


def work(spec: WorkerSpec) -> dict:
    """Claim, measure and complete items of the study until none is waiting or running (or
    the deadline passed). Returns counts of what this worker did."""
    storage = open_storage(spec.storage, spec.heartbeat_s, spec.max_retry)
    study = _study(storage, spec.study, create=False)
    sid = storage.get_study_id_from_name(spec.study)
    claim = Claimer(storage, spec.study)
    stored = study.user_attrs.get(PLAN_ATTR)
    if stored is None:
        raise ValueError(f"study {spec.study!r} has no cutetune plan")
    plan = Plan.from_json(stored)
    name = f"{socket.gethostname()}:{os.getpid()}"
    held: dict[int, str] = {}
    beat = _Heartbeat(storage, held, spec.heartbeat_s)
    beat.start()
    executor = _executor(spec, plan)
    stats = {"worker": name, "items": 0, "rows": 0, "failed": 0, "dropped": 0}
    last_sweep = 0.0
    try:
        while True:
            if time.monotonic() - last_sweep >= spec.heartbeat_s:
                last_sweep = time.monotonic()
                with study_lock(storage, spec.study), warnings.catch_warnings():
                    warnings.simplefilter("ignore", ExperimentalWarning)
                    optuna.storages.fail_stale_trials(study)
            while time.time() < spec.deadline and executor.room():
                claimed = claim()
                if claimed is None:
                    break
                tid, t = claimed
                held[tid] = key = t.user_attrs.get(ITEM_ATTR, "")
                storage.set_trial_user_attr(tid, WORKER_ATTR, name)
                try:
                    if key not in plan.items:
                        raise ValueError(f"item {key!r} is not in the study's plan")
                    executor.submit(tid, plan.items[key], plan.configs(plan.items[key]))
                except ValueError as e:  # this item cannot run here: fail it, go on
                    held.pop(tid)
                    _finish(storage, Done(tid, [], str(e)))
                    stats["failed"] += 1
            if not held:
                if time.time() >= spec.deadline or not storage.get_all_trials(
                        sid, deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING)):
                    break
                # others still run items: one may die and its item come back to the queue
                time.sleep(min(1.0, spec.heartbeat_s / 2))
                continue
            for done in executor.poll(timeout=0.5):
                held.pop(done.job_id)
                if not _finish(storage, done):
                    stats["dropped"] += 1
                elif done.error:
                    stats["failed"] += 1
                else:
                    stats["items"] += 1
                    stats["rows"] += len(done.rows)
    finally:
        beat.stopped.set()
        executor.close()
    return stats


def _finish(storage, done: Done) -> bool:
    """Store the outcome on the trial; False if the trial was failed meanwhile (its retry owns
    the item now, so this result is dropped)."""
    try:
        if done.error:
            storage.set_trial_user_attr(done.job_id, ERROR_ATTR, done.error[:2000])
            storage.set_trial_state_values(done.job_id, state=TrialState.FAIL)
        else:
            storage.set_trial_user_attr(done.job_id, ROWS_ATTR, encode_rows(done.rows))
            storage.set_trial_state_values(done.job_id, state=TrialState.COMPLETE,
                                           values=[float(len(done.rows))])
        return True
    except UpdateFinishedTrialError:
        print(f"fleet: trial {done.job_id} was failed as stale before it finished here; "
              f"its retry records the item", file=sys.stderr)
        return False


def _worker_process(spec: WorkerSpec) -> None:
    # Before anything touches CUDA: this process and its GPU worker see one device.
    if spec.gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.gpu
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    stats = work(spec)
    print(f"fleet: worker {stats['worker']} (GPU {spec.gpu}): {stats['items']} items, "
          f"{stats['rows']} rows, {stats['failed']} failed, {stats['dropped']} dropped",
          file=sys.stderr, flush=True)


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
    have = dataset.done_keys(out)
    new = []
    for r in rows:
        k = tuple(r[c] for c in dataset.KEY_COLUMNS)
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
    from .compile import cache_dir

    path = cache_dir() / "fleet.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def requested(args) -> bool:
    """Whether a collect command asks for fleet mode."""
    return bool(args.storage) or args.workers is not None or args.backend != "gpu"


def add_arguments(p) -> None:
    """The fleet options of `cutetune collect`."""
    g = p.add_argument_group(
        "fleet", "Given --storage or --workers, work items queue in an Optuna study; every host "
        "running the same command shares them, and the run ends by exporting the study to --out.")
    g.add_argument("--storage", default=None, metavar="URL",
                   help="Optuna RDB storage: postgresql://USER@HOST/DB for many hosts, "
                        "sqlite:///FILE for one (default with --workers: an SQLite file in the "
                        "cutetune cache folder)")
    g.add_argument("--workers", type=int, default=None, metavar="N",
                   help="worker processes on this host, worker i pinned to visible GPU i mod "
                        "count (default: one per visible GPU; 1 for a replay backend)")
    g.add_argument("--study", default=None,
                   help="study name (default: derived from the problems, configs, arch, dtype "
                        "and seed)")
    g.add_argument("--backend", default="gpu",
                   help="gpu, or replay:PATH to answer items from a recorded dataset (no GPU)")
    g.add_argument("--replay-delay", type=float, default=0.0, metavar="S",
                   help="replay backend: seconds each item takes")
    g.add_argument("--item-size", type=int, default=CHUNK, metavar="N",
                   help="most configs in one work item (default %(default)s)")
    g.add_argument("--heartbeat", type=int, default=20, metavar="S",
                   help=f"seconds between a worker's heartbeats; a trial whose worker missed "
                        f"{GRACE_HEARTBEATS} is failed and queued again (default %(default)s)")
    g.add_argument("--max-retry", type=int, default=3,
                   help="times one item is queued again after its worker died (default 3)")


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
    if args.item_size < 1 or args.heartbeat < 1 or args.max_retry < 0:
        raise ValueError("--item-size and --heartbeat must be at least 1, --max-retry at least 0")
    if args.backend == "gpu":
        gpus = visible_gpus()
        if not gpus:
            raise ValueError("no GPU is visible: collect on a GPU host, or pass "
                             "--backend replay:PATH")
    else:
        gpus = [None]
    n = args.workers if args.workers is not None else len(gpus)
    if n < 1:
        raise ValueError("--workers must be at least 1")
    url = args.storage or default_storage()
    problems = load_problems(args.problems, args.dtype, args.arch, args.seed)[:args.limit_problems]
    spec_problems = args.problems + (f"[:{args.limit_problems}]" if args.limit_problems else "")
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
    print(f"fleet: study {name!r} in {_safe_url(url)}: {len(plan.items)} items planned, "
          f"{enqueued} enqueued now; {n} workers here", file=sys.stderr, flush=True)
    cache = kernel_cache_dir(args.cache_dir)
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
        Path(args.stats).parent.mkdir(parents=True, exist_ok=True)
        Path(args.stats).write_text(json.dumps(stats, indent=1))
    unfinished = counts["items"] - counts["complete"]
    if unfinished and time.time() - t0 < args.time_budget:
        print(f"fleet: {unfinished} items are not complete ({counts['lost']} lost); run the "
              f"command again to queue them", file=sys.stderr)
        return 1
    return 0


def register(sub) -> None:
    p = sub.add_parser("fleet", help="status and export of a fleet collection study",
                       description=__doc__.split("\n\n")[0])
    fsub = p.add_subparsers(dest="fleet_command", metavar="ACTION", required=True)
    for action, help_ in (("status", "items by state"),
                          ("export", "append the study's measurements to a dataset")):
        a = fsub.add_parser(action, help=help_)
        a.add_argument("--storage", required=True, metavar="URL")
        a.add_argument("--study", required=True)
        if action == "export":
            a.add_argument("--out", required=True, help="dataset folder")
        a.set_defaults(func=_run_action)


def _run_action(args) -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = _study(open_storage(args.storage), args.study, create=False)
    if args.fleet_command == "status":
        print(json.dumps(status(study)))
    else:
        print(json.dumps(export(study, args.out)))
    return 0
