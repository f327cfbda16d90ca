"""A fleet worker: claim an item, measure it (on the GPU, or replayed), store its rows on the
trial, with a heartbeat that lets other workers re-queue the item if this one dies."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Protocol

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from ...models import dataset
from ...space.config import KernelConfig
from ..measure.executor import Done, GpuExecutor
from ..measure.timing import TimingPolicy
from ..search.storage import (Heartbeat, fail_stale_trials, holder_name, open_storage,
    study_lock)
from .plan import ERROR_ATTR, ITEM_ATTR, PLAN_ATTR, Plan, ROWS_ATTR, WORKER_ATTR, WorkItem
from .queue import Claimer, _study, encode_rows

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
        self.rows = {dataset.row_key(r): r for r in table.to_pylist()}
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
        keys = [dataset.measurement_key(pk, "quack", c.short()) for c in configs]
        keys = [dataset.measurement_key(pk, "cublas")] + keys if item.cublas else keys
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
    name = holder_name()
    held: dict[int, str] = {}
    beat = Heartbeat(storage, held, spec.heartbeat_s)
    beat.start()
    executor = _executor(spec, plan)
    stats = {"worker": name, "items": 0, "rows": 0, "failed": 0, "dropped": 0}
    last_sweep = 0.0
    try:
        while True:
            if time.monotonic() - last_sweep >= spec.heartbeat_s:
                last_sweep = time.monotonic()
                with study_lock(storage, spec.study):
                    fail_stale_trials(study)
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
