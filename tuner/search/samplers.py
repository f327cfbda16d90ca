"""Search strategies as Optuna samplers over one problem's valid configs.

The study's parameters are one integer per config axis: the index of the value in that
axis's sorted values (tile_m, tile_n, pingpong, cluster_m, cluster_n, swap_ab,
max_swizzle_size, split_k, ...; an axis with one value is left out). Ordered integers rather
than one categorical over ~2400 configs, because that is what makes the baselines meaningful:
TPE's Parzen estimators and CMA-ES's Gaussian then see that tile_n 192 lies between 160 and
208 and learn per-axis trends, where a flat categorical would leave TPE near random and
CMA-ES inapplicable. A point of the axis grid may break a validity rule; ``decode`` repairs
it to the nearest valid candidate (L1 over normalized axis indices), so no strategy can
propose an invalid config and the objective stays a function of the parameters.

The model-guided, list and exhaustive strategies choose the next config themselves
(ProposingSampler) and hand Optuna its exact encoding; they can also say "stop".
"""

from __future__ import annotations

import hashlib
import math
import warnings
from dataclasses import fields
from typing import Protocol, Sequence

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, IntDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.trial import FrozenTrial, TrialState
from scipy.stats import norm

from ...space.config import KernelConfig
from ...space.problem import GemmProblem

STRATEGIES = ("model", "tpe", "random", "cmaes", "exhaustive", "quack44", "nvmmh")
NVMMH_TOP_K = 8

# Trial user attributes: what every strategy reads back from a study (also after a resume).
ATTR_KEY, ATTR_STATUS, ATTR_TIME = "config_key", "status", "time_ms"


class Scorer(Protocol):
    """What the model-guided strategy needs from a cost model: a log run time per config
    (natural log of ms; the online fit absorbs a wrong offset or scale). cutetune.models'
    CostModel satisfies it; RankedTimes adapts it to use its ranker's order."""

    def predict_log_time(self, problem: GemmProblem,
                         configs: Sequence[KernelConfig]) -> np.ndarray: ...


class RankedTimes:
    """A cutetune CostModel as a Scorer: its ranker's order on its time model's scale.

    The shipped ranker (a learning-to-rank objective) orders a problem's configs better than
    the time model, but predicts no time; the guided search needs log times, to compare
    predictions with measurements. So the k-th config in the ranker's order gets the k-th
    smallest predicted time: the ranker's order, the time model's spread of times. With a
    regression ranker this is the time model itself.
    """

    def __init__(self, model):
        self.model = model

    def predict_log_time(self, problem: GemmProblem,
                         configs: Sequence[KernelConfig]) -> np.ndarray:
        configs = list(configs)
        ranked = self.model.rank(problem, configs)  # [(config, predicted ms)], ranker order
        where = {c: i for i, c in enumerate(configs)}
        out = np.empty(len(configs))
        out[[where[c] for c, _ in ranked]] = np.sort(np.log([ms for _, ms in ranked]))
        return out


class SpaceEncoding:
    """The per-axis integer parameters of one problem's candidate configs (module docstring)."""

    def __init__(self, candidates: Sequence[KernelConfig]):
        if not candidates:
            raise ValueError("no candidate configs to search")
        self.candidates = tuple(candidates)
        self.index = {c.short(): i for i, c in enumerate(self.candidates)}
        values = {f.name: sorted({getattr(c, f.name) for c in self.candidates})
                  for f in fields(KernelConfig)}
        self.axes = {name: tuple(v) for name, v in values.items() if len(v) > 1}
        self.idx = np.array([[self.axes[a].index(getattr(c, a)) for a in self.axes]
                             for c in self.candidates], dtype=np.int64).reshape(len(candidates), -1)
        span = np.array([max(len(v) - 1, 1) for v in self.axes.values()], dtype=float)
        self.coords = self.idx / span  # each axis in [0, 1]
        self._span = span

    def distributions(self) -> dict[str, BaseDistribution]:
        return {a: IntDistribution(0, len(v) - 1) for a, v in self.axes.items()}

    def encode(self, config: KernelConfig) -> dict[str, int]:
        return {a: self.axes[a].index(getattr(config, a)) for a in self.axes}

    def decode(self, params: dict) -> KernelConfig:
        """The candidate nearest to the grid point ``params`` (itself when it is valid)."""
        raw = np.array([params[a] for a in self.axes], dtype=float) / self._span
        return self.candidates[int(np.argmin(np.abs(self.coords - raw).sum(axis=1)))]

    def fingerprint(self) -> str:
        """Identifies the candidate set, so a resumed study can refuse a different space."""
        return hashlib.sha1("\n".join(sorted(self.index)).encode()).hexdigest()[:16]


class ProposingSampler(BaseSampler):
    """A sampler that picks the next config itself from what the study has measured.

    One instance serves one study. ``next_config`` returns None when the strategy is done,
    with the reason in ``stop_reason``; the tuning loop checks it before asking for a trial.
    A config that a RUNNING trial holds (another process measuring it) is not picked again.
    """

    def __init__(self, encoding: SpaceEncoding, seed: int = 0):
        self.encoding = encoding
        self.stop_reason = ""
        self._fallback = RandomSampler(seed=seed)
        self._seen: dict[str, tuple[str, float | None]] = {}
        self._scanned = 0  # every trial before this one is finished and read
        self._read_early: set[int] = set()  # finished trials read past _scanned
        self._n_read = 0
        self._busy: frozenset[str] = frozenset()
        self._choice: tuple[tuple, KernelConfig | None] | None = None

    def next_config(self, study: optuna.Study) -> KernelConfig | None:
        """The config to measure next (None: done). Cached until a trial finishes or starts,
        since the loop's stop check and the trial's sampling both ask."""
        seen = self.seen(study)
        state = (self._n_read, self._busy)
        if self._choice is None or self._choice[0] != state:
            self._choice = (state, self._choose(seen, self._busy))
        return self._choice[1]

    def _choose(self, seen: dict[str, tuple[str, float | None]],
                busy: frozenset[str]) -> KernelConfig | None:
        raise NotImplementedError

    def seen(self, study: optuna.Study) -> dict[str, tuple[str, float | None]]:
        """config_key -> (status, time_ms) of every finished trial, read incrementally (a
        trial still running is read once it finishes); also notes the configs that RUNNING
        trials hold."""
        trials = study.get_trials(deepcopy=False)
        while self._scanned < len(trials) and trials[self._scanned].state.is_finished():
            t = trials[self._scanned]
            if t.number in self._read_early:
                self._read_early.discard(t.number)
            else:
                self._read(t)
            self._scanned += 1
        busy = set()
        for t in trials[self._scanned:]:
            if t.state.is_finished() and t.number not in self._read_early:
                self._read_early.add(t.number)
                self._read(t)
            elif t.state == TrialState.RUNNING and len(t.params) == len(self.encoding.axes):
                busy.add(self.encoding.decode(t.params).short())
        self._busy = frozenset(busy)
        return self._seen

    def _read(self, trial: FrozenTrial) -> None:
        attrs = trial.user_attrs
        if ATTR_KEY in attrs:
            self._seen[attrs[ATTR_KEY]] = (attrs.get(ATTR_STATUS, ""), attrs.get(ATTR_TIME))
        self._n_read += 1

    def infer_relative_search_space(self, study, trial) -> dict[str, BaseDistribution]:
        return self.encoding.distributions()

    def sample_relative(self, study, trial: FrozenTrial, search_space) -> dict:
        config = self.next_config(study)
        return {} if config is None else self.encoding.encode(config)

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)


class ListSampler(ProposingSampler):
    """Measures a fixed list of configs in order: exhaustive search, quack's autotuning list,
    nvMatmulHeuristics' top-k."""

    def __init__(self, encoding: SpaceEncoding, configs: Sequence[KernelConfig], seed: int = 0):
        super().__init__(encoding, seed)
        self.configs = [c for c in dict.fromkeys(configs) if c.short() in encoding.index]
        self._pos = 0

    def _choose(self, seen, busy):
        while self._pos < len(self.configs) and self.configs[self._pos].short() in seen:
            self._pos += 1
        if self._pos == len(self.configs):
            self.stop_reason = f"measured all {len(self.configs)} listed configs"
            return None
        config = next((c for c in self.configs[self._pos:]
                       if c.short() not in seen and c.short() not in busy), None)
        if config is None:
            self.stop_reason = "the listed configs left are being measured by other processes"
        return config


class ModelGuidedSampler(ProposingSampler):
    """Ranks every candidate with a cost model, corrects it online, compiles only what may win.

    Each step: the model's log-time predictions, corrected for this problem by the configs
    measured so far, give a posterior mean and spread per candidate (below). Candidates
    predicted more than ``margin`` slower than the best measured time even one standard
    deviation below their mean are pruned: never compiled. Among the rest the sampler picks
    the largest expected improvement over the best (in log time, i.e. relative gain) per unit
    of cost, a config whose kernel is already built costing ``rerun_cost`` of a new one. It
    stops when no candidate survives the margin or the largest expected improvement is below
    ``min_gain``.

    The correction: an affine fit of measured log time on predicted log time (offset, and a
    scale ridge-shrunk to 1 once three configs are measured) fixes the model's level for
    this problem; a Gaussian process on the remaining residuals over the normalized axis
    coordinates moves the neighbours of measured configs (a few axis steps away) with them,
    so where the model misjudges a region of the space, measuring one config there corrects
    the configs around it. The residual variance starts at ``prior_sigma**2`` and is updated
    with the observed residuals.
    """

    # Residual GP: squared-exponential kernel over normalized axis coordinates. The swizzle
    # axis is down-weighted: it is a scheduler argument with a small, config-independent effect.
    LENGTH_SCALE = 0.5
    AXIS_WEIGHT = {"max_swizzle_size": 0.2}
    NOISE_SIGMA = 0.01  # run-to-run noise of a measured median, in log time
    SCALE_RIDGE = 0.05  # pull of the fitted scale towards 1, in (log time)^2

    def __init__(self, encoding: SpaceEncoding, problem: GemmProblem, scorer: Scorer, *,
                 margin: float = 0.05, min_gain: float = 0.001, prior_sigma: float = 0.15,
                 rerun_cost: float = 0.1, seed: int = 0):
        super().__init__(encoding, seed)
        prior = np.asarray(scorer.predict_log_time(problem, list(encoding.candidates)), float)
        if prior.shape != (len(encoding.candidates),) or not np.all(np.isfinite(prior)):
            raise ValueError("the cost model must return one finite log time per candidate")
        self.prior = prior
        self.margin, self.min_gain, self.prior_sigma = margin, min_gain, prior_sigma
        self.rerun_cost = rerun_cost
        w = np.array([self.AXIS_WEIGHT.get(a, 1.0) for a in encoding.axes])
        self._x = encoding.coords * w / self.LENGTH_SCALE
        kernels = [c.compile_key() for c in encoding.candidates]
        kid = {k: i for i, k in enumerate(dict.fromkeys(kernels))}
        self._kernel = np.array([kid[k] for k in kernels])

    def _rho(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        d2 = ((self._x[a][:, None, :] - self._x[b][None, :, :]) ** 2).sum(-1)
        return np.exp(-0.5 * d2)

    def posterior(self, idx: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of every candidate's log time given measured log times
        ``y`` of candidates ``idx`` (see the class docstring)."""
        p, n = self.prior, len(idx)
        if n == 0:
            return p.copy(), np.full(len(p), self.prior_sigma)
        scale = 1.0
        if n >= 3:
            pc, yc = p[idx] - p[idx].mean(), y - y.mean()
            scale = float(np.clip(1 + pc @ (yc - pc) / (pc @ pc + self.SCALE_RIDGE), 0.5, 2.0))
        base = scale * p + float(np.mean(y - scale * p[idx]))
        r = y - base[idx]
        tau2 = (self.prior_sigma ** 2 + float(r @ r)) / (1 + n)
        gram = tau2 * self._rho(idx, idx) + self.NOISE_SIGMA ** 2 * np.eye(n)
        cross = tau2 * self._rho(np.arange(len(p)), idx)
        chol = np.linalg.cholesky(gram)
        alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, r))
        v = np.linalg.solve(chol, cross.T)
        var = np.maximum(tau2 - (v * v).sum(0), 1e-12)
        return base + cross @ alpha, np.sqrt(var)

    def _choose(self, seen, busy):
        index = self.encoding.index
        done = np.zeros(len(self.prior), bool)
        done[[index[k] for k in seen if k in index]] = True
        if done.all():
            self.stop_reason = "measured every candidate"
            return None
        free = ~done
        free[[index[k] for k in busy if k in index]] = False
        if not free.any():
            self.stop_reason = "the candidates left are being measured by other processes"
            return None
        ok = [(index[k], math.log(t)) for k, (s, t) in seen.items()
              if s == "ok" and t is not None and k in index]
        if not ok:  # nothing to compare against yet: the model's best unmeasured pick
            return self.encoding.candidates[int(np.argmin(np.where(free, self.prior, np.inf)))]
        idx, y = (np.array(v) for v in zip(*ok))
        mu, sd = self.posterior(idx.astype(int), y)
        best = float(y.min())
        eligible = free & (mu - sd <= best + math.log1p(self.margin))
        if not eligible.any():
            self.stop_reason = f"no candidate predicted within {self.margin:.0%} of the best"
            return None
        z = (best - mu) / sd
        gain = np.where(eligible, (best - mu) * norm.cdf(z) + sd * norm.pdf(z), 0.0)
        if gain.max() < self.min_gain:
            self.stop_reason = (f"expected gain {gain.max():.2%} below the {self.min_gain:.2%} "
                                f"threshold")
            return None
        built = np.isin(self._kernel, self._kernel[done])
        cost = np.where(built, self.rerun_cost, 1.0)
        return self.encoding.candidates[int(np.argmax(gain / cost))]


# ---------------------------------------------------------------- fixed lists of configs
def quack_list(arch: str) -> list[KernelConfig]:
    """quack's sm90 autotuning list (44 configs), mapped onto our space by models.heuristics."""
    if arch != "sm90":
        raise ValueError(f"the quack44 strategy is quack's sm90 list; no mapping for {arch}")
    from ...models.baselines import quack_sm90_list

    return list(quack_sm90_list())


# ---------------------------------------------------------------- factory
def make_sampler(strategy: str, problem: GemmProblem, encoding: SpaceEncoding, *, seed: int = 0,
                 scorer: Scorer | None = None, nvmmh_top_k: int = NVMMH_TOP_K,
                 **model_options) -> BaseSampler:
    """The sampler behind a strategy name (STRATEGIES); ``scorer`` is required for "model"."""
    if strategy == "model":
        if scorer is None:
            raise ValueError("the model strategy needs a cost model (scorer)")
        return ModelGuidedSampler(encoding, problem, scorer, seed=seed, **model_options)
    if strategy == "random":
        return RandomSampler(seed=seed)
    with warnings.catch_warnings():  # multivariate TPE and CMA-ES with margin are "experimental"
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if strategy == "tpe":
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=10)
        if strategy == "cmaes":
            # with_margin keeps CMA-ES from collapsing onto one value of an integer axis.
            return optuna.samplers.CmaEsSampler(seed=seed, with_margin=True,
                                                warn_independent_sampling=False)
    if strategy == "exhaustive":
        return ListSampler(encoding, encoding.candidates, seed)
    if strategy == "quack44":
        return ListSampler(encoding, quack_list(problem.arch), seed)
    if strategy == "nvmmh":
        # nvMatmulHeuristics' picks, best estimate first, each mapped to the nearest valid
        # config of the problem (models.heuristics); the first top-k of the candidates.
        from ...models.baselines import nvmmh_valid_picks

        picks = [c for c in nvmmh_valid_picks(problem) if c.short() in encoding.index]
        return ListSampler(encoding, picks[:nvmmh_top_k], seed)
    raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
