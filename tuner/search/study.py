"""`cutetune tune`: search one problem's configs with an Optuna study, on the GPU or replayed.

The study lives in an Optuna storage (a journal file under the cache folder by default), so a
run with the same study name resumes: every strategy reads what was already measured from
the trials' attributes and never measures a config twice. GPU measurements are also appended
to a cutetune dataset, so the cost model can be retrained on what tuning found.

``tune_study`` is the loop, shared with the replay benchmark (``replay.py``): ask the
sampler for a trial, decode it to a valid config, measure it (or reuse a measured one),
tell the result, until a budget is spent or the strategy stops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState

from ...space.config import KernelConfig
from ...space.problem import GemmProblem

from ..kernels.compile import cache_dir
from .backends import BenchmarkBackend
from .samplers import (ATTR_KEY, ATTR_STATUS, ATTR_TIME, ModelGuidedSampler,
    ProposingSampler, SpaceEncoding)

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
