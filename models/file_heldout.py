"""Does the heuristics file keep its model's quality on shapes it has not seen? A held-out
replay over a dataset's CV folds (issue #35 §3).

For each fold, a cost model is trained without the fold's problems (``train_fold``, the
shipping procedure), and each held-out problem gets three answers, scored with its measured
times:

- the model's: its top-1 for the problem, and its cuBLAS-fallback decision;
- the file's: what the file emitted from that model would answer (``Grid.cell``: the model's
  top-1 and fallback decision for the nearest grid cell's shape, which is all a cell stores);
  the file's exact entries are left out, since a held-out shape has none;
- cuBLAS.

Only measured configs can be scored, so both top-1s are taken among the problem's measured
configs, as ``evaluate`` does for the model: the model ranks them at the problem's shape, the
file at its cell's shape (those valid there), and each fallback decision judges its own
restricted top-1 (``CostModel.prefers_cublas(problem, configs)``). On a problem whose whole
space was measured that is the unrestricted answer, except for configs that failed to run.
A problem whose cell is invalid for its majors, or shares no valid measured config with it,
has no file pick: the file keeps ATen there (``decisions.decide``), scored as cuBLAS.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

import numpy as np

from ..space.config import KernelConfig
from ..space.problem import layout_name
from ..space.rules import is_valid

from .data import Measurements
from .dataset import CONFIG_COLUMNS
from .evaluate import geomean, group_offsets, name_masks
from .heuristics import Grid

# Issue #35 §3: the file's top-1 against its model's, and its decision against the oracle of
# (model top-1, cuBLAS): geomean and the worst problem.
TARGETS = {"file_top1_vs_model": 0.99, "decision_vs_oracle": 0.995,
           "decision_vs_oracle_min": 0.97}


@dataclass(frozen=True)
class Replay:
    """Per held-out problem (``keys``), measured ms of each answer; the file's ms is nan
    where it has no pick (see the module)."""

    keys: tuple[str, ...]
    model_ms: np.ndarray
    model_aten: np.ndarray
    file_ms: np.ndarray
    file_aten: np.ndarray
    cublas_ms: np.ndarray
    on_grid: np.ndarray  # the problem is its own cell: the file answers as the model does
    layouts: tuple[str, ...]  # space.problem.layout_name of each problem
    best_ms: np.ndarray  # the fastest measured config's

    def decision_ms(self, source: str) -> np.ndarray:
        """Measured ms of what predicted mode runs with ``source`` ("model" or "file")."""
        top1, aten = getattr(self, f"{source}_ms"), getattr(self, f"{source}_aten")
        return np.where(aten | ~np.isfinite(top1), self.cublas_ms, top1)

    @property
    def oracle_ms(self) -> np.ndarray:
        return np.fmin(self.model_ms, self.cublas_ms)


def _answer(model, problem, configs: list[KernelConfig], times: np.ndarray
            ) -> tuple[float, bool]:
    """(measured ms of ``model``'s top-1 among ``configs`` at ``problem``'s shape, whether
    it prefers cuBLAS to that top-1); (nan, True) without a config valid at that shape."""
    ok = [i for i, c in enumerate(configs) if is_valid(c, problem.arch, problem)]
    if not ok:
        return float("nan"), True
    chosen = [configs[i] for i in ok]
    (top1, _), = model.rank(problem, chosen, top_k=1)
    # the fallback judges the top-1: ask about it alone rather than rank the set again
    return float(times[ok[chosen.index(top1)]]), bool(model.prefers_cublas(problem, [top1]))


def replay(data: Measurements, train_fold: Callable[[Measurements], object],
           splits: list[tuple[np.ndarray, np.ndarray]], grid: Grid,
           on_fold: Callable[[], object] | None = None) -> Replay:
    """The held-out answers of every test problem of ``splits`` (problem indices), each from
    ``train_fold(training problems' measurements)``, a model with ``rank`` and
    ``prefers_cublas``; ``grid``: the file's."""
    off = group_offsets(data.group)
    configs = [KernelConfig.from_dict(dict(zip(CONFIG_COLUMNS, v)))
               for v in zip(*(np.asarray(data.cols[c]).tolist() for c in CONFIG_COLUMNS))]
    rows: dict[int, tuple] = {}
    for train, test in splits:
        model = train_fold(data.subset(train))
        for p in test.tolist():
            problem, r = data.problems[p], slice(off[p], off[p + 1])
            measured, times = configs[r], data.time_ms[r]
            cell = grid.cell(problem)
            file_ms, file_aten = ((float("nan"), True) if cell is None
                                  else _answer(model, cell, measured, times))
            # as Heuristics.lookup: unbatched cells prefer cuBLAS for a batched problem
            rows[p] = (*_answer(model, problem, measured, times), file_ms,
                       file_aten or not grid.froze_batching(problem), cell == problem,
                       float(times.min()))
        if on_fold:
            on_fold()
    idx = sorted(rows)
    model_ms, model_aten, file_ms, file_aten, on_grid, best_ms = (
        np.array(c) for c in zip(*(rows[p] for p in idx)))
    problems = [data.problems[p] for p in idx]
    return Replay(tuple(q.key() for q in problems), model_ms, model_aten, file_ms, file_aten,
                  data.cublas_ms[idx], on_grid, tuple(layout_name(q) for q in problems),
                  best_ms)


def summarize(rep: Replay) -> dict:
    """The §3 ratios (file top-1 / model top-1, each source's decision / oracle; ratios > 1
    are better) with the counts behind them, and whether the file meets ``TARGETS``; the same
    ratios per layout (``by_layout``) where the problems span several."""
    out = _ratios(rep)
    out["file_meets"] = {
        "file_top1_vs_model": out["file_top1_vs_model"] >= TARGETS["file_top1_vs_model"],
        **{k: out["file"][k] >= TARGETS[k] for k in ("decision_vs_oracle",
                                                     "decision_vs_oracle_min")}}
    masks = name_masks(rep.layouts)
    if masks:
        out["by_layout"] = {name: _ratios(_subset(rep, mask)) for name, mask in masks.items()}
    return out


def _subset(rep: Replay, mask: np.ndarray) -> Replay:
    """The problems of ``mask`` alone."""
    def take(values):
        return (tuple(v for v, keep in zip(values, mask) if keep) if isinstance(values, tuple)
                else values[mask])

    return Replay(**{f.name: take(getattr(rep, f.name)) for f in fields(Replay)})


def _ratios(rep: Replay) -> dict:
    picked = np.isfinite(rep.file_ms)
    top1 = rep.model_ms[picked] / rep.file_ms[picked]
    vs_best = rep.best_ms / rep.model_ms
    vs_best = vs_best[np.isfinite(vs_best)]  # as geomean: a problem without a top-1 is left out
    out: dict = {"problems": len(rep.keys), "on_grid": int(rep.on_grid.sum()),
                 "file_without_pick": int((~picked).sum()),
                 "file_top1_vs_model": geomean(top1),
                 "file_top1_vs_model_min": float(top1.min()) if top1.size else float("nan"),
                 "model_top1_vs_best": geomean(vs_best),
                 "model_top1_vs_best_p10": (float(np.quantile(vs_best, 0.1)) if vs_best.size
                                            else float("nan")),
                 "model_top1_vs_cublas": geomean(rep.cublas_ms / rep.model_ms),
                 "oracle_vs_cublas": geomean(rep.cublas_ms / rep.oracle_ms)}
    for source in ("file", "model"):
        ratio = rep.oracle_ms / rep.decision_ms(source)
        aten = getattr(rep, f"{source}_aten") | ~np.isfinite(getattr(rep, f"{source}_ms"))
        out[source] = {"decision_vs_oracle": geomean(ratio),
                       "decision_vs_oracle_min": float(np.nanmin(ratio)),
                       "below_min_target": int(np.sum(ratio < TARGETS["decision_vs_oracle_min"])),
                       "decision_vs_cublas": geomean(rep.cublas_ms / rep.decision_ms(source)),
                       "keeps_cublas": int(aten.sum())}
    return out
