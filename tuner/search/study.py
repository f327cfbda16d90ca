"""`cutetune tune`: search one problem's configs with an Optuna study, on the GPU or replayed.

The study lives in an Optuna storage (a journal file under the cache folder by default), so a
run with the same study name resumes: every strategy reads what was already measured from
the trials' attributes and never measures a config twice. A trial left RUNNING by a process
that died is failed once its heartbeat is stale, and its config can be measured again. GPU measurements are also appended
to a cutetune dataset, so the cost model can be retrained on what tuning found.

``tune_study`` is the loop, shared with the replay benchmark (``replay.py``): ask the
sampler for a trial, decode it to a valid config, measure it (or reuse a measured one),
tell the result, until a budget is spent or the strategy stops.
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from ...space.config import KernelConfig
from ...space.problem import GemmProblem

from ... import settings
from .backends import BenchmarkBackend
from .samplers import (ATTR_KEY, ATTR_STATUS, ATTR_TIME, ModelGuidedSampler,
    ProposingSampler, SpaceEncoding)
from .storage import (GRACE_HEARTBEATS, HOLDER_ATTR, Heartbeat, fail_stale_trials, holder_name,
    shared, study_lock)

DEFAULT_TRIALS = {"model": 64, "tpe": 64, "random": 64, "cmaes": 64}
# A stochastic sampler that keeps proposing measured configs has converged; stop it after
# this many in a row (they cost nothing but never end).
MAX_REPEATS = 200
SPACE_ATTR = "cutetune_space"
_MODEL_DEFAULTS = ModelGuidedSampler.__init__.__kwdefaults__


def default_storage_url() -> str:
    return f"journal:{settings.cache_dir() / 'studies.journal'}"


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
    # the same for configs that other processes measured in the study while this run went on
    others: dict = field(default_factory=dict)

    @property
    def kernels(self) -> int:
        return sum(s.new_kernel for s in self.steps)

    @property
    def cost_s(self) -> float:
        return sum(s.compile_s + s.bench_s for s in self.steps)

    def best(self) -> tuple[str, float] | None:
        """(config_key, time_ms) of the fastest ok config in the study."""
        times = {**self.earlier, **self.others}
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
    or the strategy stops; ``on_measure(measurement)`` sees each new measurement.

    In a storage with heartbeats (storage.open_storage) other processes may share the study:
    the trial being measured keeps a heartbeat, stale trials of dead processes are failed,
    and choosing a config and taking its trial happen under the study lock, so a proposing
    strategy never picks a config that another process is measuring. When such a strategy
    has nothing left but what others are measuring, it waits for their results (or for their
    trials to go stale) before it stops. A trial this loop cannot finish (an error, Ctrl-C) is
    failed before the error propagates, so no run leaves a trial RUNNING behind it."""
    multi = shared(study)
    storage = study._storage
    interval = storage.get_heartbeat_interval() if multi else 0
    memo = _history(study)
    earlier = {k: t for k, (s, t) in memo.items() if s == "ok"}
    built: set[KernelConfig] = set()
    steps: list[Step] = []
    repeats, cost = 0, 0.0
    held: dict[int, str] = {}
    beat = Heartbeat(storage, held, interval) if multi else None
    if beat is not None:
        beat.start()
    waited = False
    try:
        while True:
            reason = _spent(budget, len(steps), len(built), cost)
            if reason:
                break
            trial = running = None
            with study_lock(storage, study.study_name) if multi else nullcontext():
                if multi:
                    fail_stale_trials(study)
                if isinstance(sampler, ProposingSampler) and sampler.next_config(study) is None:
                    running = multi and study.get_trials(deepcopy=False,
                                                         states=(TrialState.RUNNING,))
                    if not running:
                        reason = sampler.stop_reason
                        break
                else:
                    trial = _take(study, storage, encoding, held, multi)
            if trial is None:  # wait for the others' results, or for their trials to go stale
                if not waited:
                    print(f"tune: waiting for {len(running)} trials of other processes (one "
                          f"whose process died is failed after {GRACE_HEARTBEATS * interval} s "
                          f"without a heartbeat)", file=sys.stderr, flush=True)
                    waited = True
                time.sleep(min(1.0, interval / 2))
                continue
            try:
                config = encoding.decode(trial.params)
                key = config.short()
                if multi and key not in memo:  # another process may have measured it
                    memo.update(_history(study))
                if key in memo:
                    (status, time_ms), reused, compile_s, bench_s = memo[key], True, 0.0, 0.0
                    repeats += 1
                else:
                    m = backend.measure(problem, [config])[0]
                    status, time_ms, compile_s, bench_s = (m.status, m.time_ms, m.compile_s,
                                                           m.bench_s)
                    reused = False
                    memo[key] = (status, time_ms)
                    repeats = 0
                    if on_measure is not None:
                        on_measure(m)
            except BaseException:
                held.pop(trial._trial_id, None)
                _fail(study, trial)
                raise
            held.pop(trial._trial_id, None)
            new_kernel = not reused and config.compile_key() not in built
            if new_kernel:
                built.add(config.compile_key())
            cost += compile_s + bench_s
            ok = status == "ok" and time_ms is not None and math.isfinite(time_ms)
            _record(study, trial, time_ms if ok else None,
                    {ATTR_KEY: key, ATTR_STATUS: status, ATTR_TIME: time_ms,
                     "compile_s": compile_s, "bench_s": bench_s, "reused": reused})
            steps.append(Step(config, status, time_ms if ok else None, compile_s, bench_s,
                              new_kernel, reused))
            if repeats >= MAX_REPEATS:
                reason = f"the sampler proposed {MAX_REPEATS} measured configs in a row"
                break
    finally:
        if beat is not None:
            beat.stopped.set()
    others = {k: t for k, (s, t) in _history(study).items()
              if s == "ok" and k not in earlier} if multi else {}
    return TuneResult(problem, tuple(steps), reason, earlier, others)


def _take(study, storage, encoding: SpaceEncoding, held: dict, multi: bool) -> optuna.Trial:
    """A new trial with the sampler's config; in a shared study it carries its first
    heartbeat and its holder, and the heartbeat thread keeps it alive from then on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
        trial = study.ask(encoding.distributions())
    if multi:
        storage.record_heartbeat(trial._trial_id)
        trial.set_user_attr(HOLDER_ATTR, holder_name())
        held[trial._trial_id] = encoding.decode(trial.params).short()
    return trial


def _record(study, trial, value: float | None, attrs: dict) -> None:
    """Store a measured trial: its attributes, then COMPLETE with ``value`` (FAIL if None).
    A trial that another process failed as stale meanwhile keeps its state."""
    try:
        for name, v in attrs.items():
            trial.set_user_attr(name, v)
        if value is not None:
            study.tell(trial, value)
        else:
            study.tell(trial, state=TrialState.FAIL)
    except UpdateFinishedTrialError:
        print(f"tune: trial {trial.number} was failed as stale before it finished here; its "
              f"result is not recorded in the study", file=sys.stderr)


def _fail(study, trial) -> None:
    try:
        study.tell(trial, state=TrialState.FAIL)
    except UpdateFinishedTrialError:
        pass


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
