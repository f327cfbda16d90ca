"""Held-out scores of each method: fit on some problems, score the rows of the others.

Each row's out-of-fold score comes from the one fold model that did not see its problem, so
per-problem metrics over the out-of-fold scores are held-out metrics of every problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .data import Measurements, with_extra
from .evaluate import ProblemScores, score_problems
from .methods import Method


@dataclass(frozen=True)
class HeldOut:
    """A method's out-of-fold row scores over ``data`` and the per-problem metrics they give."""

    method: Method
    row_scores: np.ndarray
    problems: ProblemScores
    coverage: np.ndarray | None  # see Method.coverage


def held_out_scores(data: Measurements, X: np.ndarray, method: Method,
                    splits: list[tuple[np.ndarray, np.ndarray]], seed: int = 0,
                    on_fold: Callable[[], object] | None = None,
                    extra: tuple[Measurements, np.ndarray] | None = None,
                    family_out: bool = False) -> HeldOut:
    """Out-of-fold scores of ``method`` over the test problems of ``splits`` (problem indices).

    Rows of problems in no test set keep a nan score; the metrics cover only tested problems.
    ``on_fold()`` (a bar's ``update``) follows each fold's fit and scoring. ``extra``
    (measurements and their feature rows, another dtype's) joins each fold's fit, less its
    problems of the test problems' layers, and with ``family_out`` (each test set a family held
    out whole) of their families: ``with_extra``; it is never scored.
    """
    scores = np.full(len(data.time_ms), np.nan)
    for train, test in splits:
        if np.intersect1d(train, test).size:
            raise ValueError("a split has problems in both train and test")
        tr, te = data.rows_of(train), data.rows_of(test)
        fit_data, fit_X = data.subset(train), X[tr]
        if extra is not None:
            fit_data, fit_X = with_extra(fit_data, fit_X, extra,
                                         [data.problems[i] for i in test],
                                         set(data.families[test]) if family_out else ())
        method.fit(fit_data, fit_X)
        scores[te] = method.score(data.subset(test), X[te])
        if on_fold:
            on_fold()
    return scored(data, method, scores, splits, seed)


def scored(data: Measurements, method: Method, scores: np.ndarray,
           splits: list[tuple[np.ndarray, np.ndarray]], seed: int = 0) -> HeldOut:
    """The HeldOut of ``method`` whose out-of-fold row scores over ``splits`` are ``scores``:
    ``held_out_scores`` without the fits, for scores that follow from other methods' (a
    blend's, from those of the ranker and the time model it sums)."""
    tested = np.zeros(data.n_problems, bool)
    for _, test in splits:
        tested[test] = True
    sub = data.subset(np.flatnonzero(tested))
    rows = data.rows_of(np.flatnonzero(tested))
    ps = score_problems(sub.time_ms, scores[rows], sub.group, sub.m, sub.cublas_ms, seed=seed)
    coverage = method.coverage(sub) if method.coverage else None
    return HeldOut(method, scores, ps, coverage)
