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
import json
import os
import random
import zlib
from contextlib import nullcontext

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from ..search.storage import study_lock
from .plan import ITEM_ATTR, PLAN_ATTR, Plan, Work


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
