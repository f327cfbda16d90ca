"""Replay benchmark: compare search strategies on the CPU from recorded exhaustive sweeps.

Each strategy tunes each problem through the same loop as `cutetune tune` (tune_study), with a
ReplayBackend answering from the recorded measurements. Because every valid config of the
problem was recorded, the oracle (the fastest ok config) is known and a run's best-so-far
can be scored after every measurement: oracle efficiency = t_oracle / t_best_so_far, against
the kernels compiled so far and the tuning time charged so far (recorded compile time per
kernel + estimated benchmark time, see backends.ReplayBackend). Exhaustive search of the
same space is the reference: it builds every kernel and times every config.
"""

from __future__ import annotations

import json
import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import optuna

from ...models.evaluate import geomean
from ...space.enumerate import enumerate_configs
from ...space.problem import GemmProblem

from .backends import ReplayBackend
from .samplers import Scorer, SpaceEncoding, make_sampler
from .study import Budget, tune_study

TARGET = 0.99
# Strategies that do not depend on the seed run once per problem.
DETERMINISTIC = ("exhaustive", "quack44", "nvmmh", "model")


@dataclass(frozen=True)
class Run:
    """One strategy tuning one problem. The tuples have one entry per new measurement:
    kernels built, tuning seconds charged and best ok time so far (inf before the first)."""

    problem_key: str
    strategy: str
    seed: int
    oracle_ms: float
    exhaustive_s: float
    n_kernels_space: int  # compile keys in the problem's space: what exhaustive search builds
    kernels: tuple[int, ...]
    cost_s: tuple[float, ...]
    best_ms: tuple[float, ...]
    stop_reason: str

    def efficiency(self) -> np.ndarray:
        return self.oracle_ms / np.asarray(self.best_ms, float)

    def _first(self, frac: float) -> int | None:
        hit = np.flatnonzero(self.efficiency() >= frac - 1e-12)
        return int(hit[0]) if len(hit) else None

    def kernels_to(self, frac: float = TARGET) -> float:
        i = self._first(frac)
        return math.inf if i is None else float(self.kernels[i])

    def cost_to(self, frac: float = TARGET) -> float:
        i = self._first(frac)
        return math.inf if i is None else self.cost_s[i]

    @property
    def final_efficiency(self) -> float:
        return float(self.efficiency()[-1]) if self.best_ms else 0.0

    @property
    def total_kernels(self) -> int:
        return self.kernels[-1] if self.kernels else 0

    @property
    def total_cost_s(self) -> float:
        return self.cost_s[-1] if self.cost_s else 0.0


def exhaustive_problems(backend: ReplayBackend) -> list[GemmProblem]:
    """Recorded problems whose rows cover every valid config: the ones with a known oracle."""
    out = []
    for p in backend.problems():
        recorded = {c.short() for c in backend.configs(p)}
        valid = enumerate_configs(p.arch, p)
        if all(c.short() in recorded for c in valid) and _oracle(backend, p, valid) < math.inf:
            out.append(p)
    return out


def _oracle(backend: ReplayBackend, problem: GemmProblem, configs) -> float:
    times = [backend.recorded(problem, c).time_ms for c in configs]
    return min((t for t in times if t is not None), default=math.inf)


@dataclass(frozen=True)
class Reference:
    """What exhaustive search of a problem's space finds and costs."""

    oracle_ms: float
    exhaustive_s: float
    n_kernels: int


def reference(backend: ReplayBackend, problem: GemmProblem) -> Reference:
    candidates = enumerate_configs(problem.arch, problem)
    charged = backend.fresh().measure(problem, candidates)
    return Reference(_oracle(backend, problem, candidates),
                     sum(m.compile_s + m.bench_s for m in charged),
                     len({c.compile_key() for c in candidates}))


def replay_one(backend: ReplayBackend, problem: GemmProblem, strategy: str, seed: int,
               budget: Budget, scorer: Scorer | None = None, ref: Reference | None = None,
               **model_options) -> Run:
    """Tune ``problem`` with ``strategy`` against the recorded measurements (a fresh
    in-memory study, no kernel built yet)."""
    ref = ref or reference(backend, problem)
    encoding = SpaceEncoding(enumerate_configs(problem.arch, problem))
    sampler = make_sampler(strategy, problem, encoding, seed=seed, scorer=scorer, **model_options)
    study = optuna.create_study(sampler=sampler, direction="minimize")
    result = tune_study(study, sampler, problem, encoding, backend.fresh(), budget)
    kernels, cost, best = [], [], []
    k, c, b = 0, 0.0, math.inf
    for s in result.steps:
        if s.reused:
            continue
        k, c = k + s.new_kernel, c + s.compile_s + s.bench_s
        if s.time_ms is not None:
            b = min(b, s.time_ms)
        kernels.append(k), cost.append(c), best.append(b)
    return Run(problem.key(), strategy, seed, ref.oracle_ms, ref.exhaustive_s, ref.n_kernels,
               tuple(kernels), tuple(cost), tuple(best), result.stop_reason)


# Worker-process state: the backend is shipped once per worker, not once per task.
_WORKER: dict = {}


def _init_worker(backend: ReplayBackend) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    _WORKER["backend"] = backend


def _task(args) -> Run:
    problem, strategy, seed, budget, ref, extra = args
    return replay_one(_WORKER["backend"], problem, strategy, seed, budget, ref=ref, **extra)


def replay(backend: ReplayBackend, problems: Sequence[GemmProblem], strategies: Sequence[str],
           seeds: Sequence[int], budgets: Mapping[str, Budget],
           scorers: Mapping[str, Scorer] | None = None, model_options: Mapping | None = None,
           workers: int = 1) -> list[Run]:
    """Every (problem, strategy, seed) run; seed-independent strategies (DETERMINISTIC) run
    with the first seed only. ``scorers`` maps problem_key to the cost model for that problem
    (trained without it); ``budgets`` maps strategy to its Budget (default: none)."""
    tasks = []
    for p in problems:
        ref = reference(backend, p)
        for s in strategies:
            for seed in (seeds[:1] if s in DETERMINISTIC else seeds):
                extra = ({"scorer": scorers[p.key()], **(model_options or {})}
                         if s == "model" else {})
                tasks.append((p, s, seed, budgets.get(s, Budget()), ref, extra))
    if workers <= 1:
        _init_worker(backend)
        return [_task(t) for t in tasks]
    # spawn, not fork: a forked child of a process that has run XGBoost's OpenMP threads can
    # deadlock in its first prediction.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_init_worker, initargs=(backend,)) as pool:
        return list(pool.map(_task, tasks, chunksize=4))


# ---------------------------------------------------------------- summary and report
def _median(x) -> float:
    x = np.asarray(list(x), float)
    return float(np.median(x)) if len(x) else math.nan


def efficiency_at(runs: Sequence[Run], grid: np.ndarray, axis: str) -> np.ndarray:
    """Geometric-mean oracle efficiency over ``runs`` after ``grid`` kernels (axis="kernels")
    or after ``grid`` x the exhaustive tuning time (axis="time"). A run that stopped keeps
    its final best; before its first ok measurement it scores 0 (reported as a floor of
    1e-3 in the geometric mean)."""
    out = np.empty((len(runs), len(grid)))
    for i, r in enumerate(runs):
        x = np.asarray(r.kernels if axis == "kernels" else np.asarray(r.cost_s) / r.exhaustive_s)
        eff = np.maximum(r.efficiency(), 1e-3)
        pos = np.searchsorted(x, grid, side="right") - 1
        out[i] = np.where(pos >= 0, eff[np.maximum(pos, 0)], 1e-3)
    return np.exp(np.log(out).mean(axis=0))


def summarize(runs: Sequence[Run], target: float = TARGET) -> dict:
    """Per strategy: kernels and tuning time to reach ``target`` of the oracle, totals until
    the strategy stopped, and final efficiency."""
    out = {}
    for s in dict.fromkeys(r.strategy for r in runs):
        rs = [r for r in runs if r.strategy == s]
        reach = [r.kernels_to(target) for r in rs]
        out[s] = {
            "runs": len(rs),
            "problems": len({r.problem_key for r in rs}),
            "reached_frac": float(np.mean(np.isfinite(reach))),
            "median_kernels_to_target": _median(reach),
            "median_time_to_target_vs_exhaustive": _median(r.cost_to(target) / r.exhaustive_s
                                                           for r in rs),
            "median_kernels_total": _median(r.total_kernels for r in rs),
            "median_speedup_vs_exhaustive": _median(r.exhaustive_s / r.total_cost_s for r in rs),
            "geomean_speedup_vs_exhaustive": geomean([r.exhaustive_s / r.total_cost_s for r in rs]),
            "final_efficiency_geomean": geomean([max(r.final_efficiency, 1e-3) for r in rs]),
            "final_efficiency_min": float(min(r.final_efficiency for r in rs)),
            "final_efficiency_p10": float(np.percentile([r.final_efficiency for r in rs], 10)),
        }
    return out


def plot(runs: Sequence[Run], path: str | Path, max_kernels: int = 128) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_k, ax_t) = plt.subplots(1, 2, figsize=(12, 4.5))
    kgrid = np.arange(1, max_kernels + 1)
    tgrid = np.logspace(-4, 0, 200)
    for s in dict.fromkeys(r.strategy for r in runs):
        rs = [r for r in runs if r.strategy == s]
        ax_k.plot(kgrid, efficiency_at(rs, kgrid, "kernels"), label=s)
        ax_t.plot(tgrid, efficiency_at(rs, tgrid, "time"), label=s)
    for ax in (ax_k, ax_t):
        ax.set_xscale("log")
        ax.axhline(TARGET, color="gray", lw=0.8, ls="--")
        ax.set_ylim(0.5, 1.005)
        ax.set_ylabel("oracle efficiency, geomean over runs")
        ax.grid(alpha=0.3)
    ax_k.set_xlabel("kernels compiled")
    ax_t.set_xlabel("tuning time / exhaustive tuning time")
    ax_k.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _fmt(v: float, spec: str) -> str:
    return "never" if v == math.inf else ("n/a" if v != v else format(v, spec))


def report_markdown(summaries: Mapping[str, Mapping], meta: Mapping, png_name: str) -> str:
    """``summaries``: section title -> ``summarize`` output, one table each."""
    lines = [f"# Replay benchmark: {meta['title']}", ""]
    lines += [f"- {k}: {v}" for k, v in meta["facts"].items()]
    lines += ["", f"![oracle efficiency vs kernels and tuning time]({png_name})"]
    for title, summary in summaries.items():
        lines += ["", f"## {title}", ""] + _table(summary)
    lines += ["", "## Method", ""] + [f"- {m}" for m in meta["method"]]
    if meta.get("targets"):
        lines += ["", "## Targets", ""] + [f"- {t}" for t in meta["targets"]]
    return "\n".join(lines) + "\n"


def _table(summary: Mapping) -> list[str]:
    lines = [f"| strategy | runs | reached {TARGET} | median kernels to {TARGET} | "
             f"median time to {TARGET} / exhaustive | median kernels total | "
             "median speedup vs exhaustive | final eff. geomean | final eff. min |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s, v in summary.items():
        lines.append(
            f"| {s} | {v['runs']} | {v['reached_frac']:.0%} | "
            f"{_fmt(v['median_kernels_to_target'], 'g')} | "
            f"{_fmt(v['median_time_to_target_vs_exhaustive'], '.4f')} | "
            f"{_fmt(v['median_kernels_total'], 'g')} | "
            f"{_fmt(v['median_speedup_vs_exhaustive'], '.1f')}x | "
            f"{v['final_efficiency_geomean']:.4f} | {v['final_efficiency_min']:.4f} |")
    return lines


def write_report(runs: Sequence[Run], summaries: Mapping[str, Mapping], meta: Mapping,
                 stem: str | Path) -> list[Path]:
    """``stem``.md, .json (summaries, meta and every run's trace) and .png."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    png = stem.with_suffix(".png")
    plot(runs, png)
    md = stem.with_suffix(".md")
    md.write_text(report_markdown(summaries, meta, png.name))
    js = stem.with_suffix(".json")

    def clean(v):  # JSON has no inf/nan
        if isinstance(v, float) and not math.isfinite(v):
            return None if v != v else "inf"
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v

    js.write_text(json.dumps(clean({"meta": meta, "summaries": summaries,
                                    "runs": [asdict(r) for r in runs]}), separators=(",", ":")))
    return [md, js, png]
