"""The kinds of problem a cost model is trained for: dense GEMMs and grouped (MoE expert) GEMMs.

A model ranks one kind: the kinds have different feature sets (``space.features``), a
different ATen baseline in the dataset (torch.mm, which runs cuBLAS, for dense problems;
torch._grouped_mm for grouped ones) and a different size that buckets them (M; the routed rows,
M_total). Training, evaluation, the fallback and the model file go through the same code for
both and read what differs from here, never from the dense feature set directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..space.features import (DERIVED_NAMES, FEATURE_NAMES, GROUPED_FEATURE_NAMES,
    feature_matrix, grouped_feature_matrix, grouped_problem_columns, problem_columns)
from ..space.problem import GemmProblem, GroupedProblem, ProblemError

from .evaluate import M_BUCKETS, M_TOTAL_BUCKETS

# Features that depend on the problem only: what the ATen-fallback model sees of a problem.
PROBLEM_FEATURES = ("m", "n", "k", "batch", "in_bytes", "out_bytes", "a_m_major", "b_n_major",
                    "log2_m", "log2_n", "log2_k", "log2_batch", "log2_flops", "log2_ai_problem",
                    "log2_footprint_over_l2", "log2_ideal_s")
# A grouped problem's: its sizes, its own problem features, and those of its balanced routing.
GROUPED_PROBLEM_FEATURES = (
    ("experts", "m", "n", "k", "varlen_k", "log2_experts", "log2_ragged", "rows_per_expert",
     "log2_rows_per_expert", "active_experts", "log2_ideal_s")
    + tuple(f"balanced_{f}" for f in PROBLEM_FEATURES if f in DERIVED_NAMES))


@dataclass(frozen=True)
class ProblemKind:
    """What a cost model of one kind of problem reads and compares against."""

    name: str
    problem_type: type
    feature_names: tuple[str, ...]
    problem_features: tuple[str, ...]
    # The feature the regression objective divides times by (see learners.BoosterModel): the
    # config's roofline time (a grouped problem's: that of its balanced routing).
    roofline: str
    matrix: Callable  # (columns, device) -> float32 (rows, len(feature_names))
    columns: Callable  # (problem, rows) -> the problem's columns, broadcast
    problem_columns: tuple[str, ...]  # the dataset columns that describe a problem
    baseline_backend: str  # the dataset backend of the problem's ATen row
    baseline: str  # that baseline's name in reports and messages
    buckets: tuple[tuple[int, int | None], ...]
    bucket_label: str  # what ``size`` is, in bucket names
    size: Callable[[object], int]  # the problem size the buckets split

    @property
    def roofline_idx(self) -> int:
        return self.feature_names.index(self.roofline)

    @property
    def problem_idx(self) -> list[int]:
        return [self.feature_names.index(f) for f in self.problem_features]


DENSE = ProblemKind(
    "dense", GemmProblem, FEATURE_NAMES, PROBLEM_FEATURES, "roofline_s", feature_matrix,
    problem_columns, ("arch", "m", "n", "k", "batch", "dtype", "out_dtype", "a_major", "b_major"),
    "cublas", "cuBLAS", M_BUCKETS, "M", lambda p: p.m)
GROUPED = ProblemKind(
    # the baseline backend is tuner.measure.grouped.ATEN_BACKEND (a test holds them equal)
    "grouped", GroupedProblem, GROUPED_FEATURE_NAMES, GROUPED_PROBLEM_FEATURES,
    "balanced_roofline_s", grouped_feature_matrix, grouped_problem_columns,
    ("arch", "experts", "m", "n", "k", "gemm", "dtype", "out_dtype"), "aten",
    "torch._grouped_mm", M_TOTAL_BUCKETS, "M_total",
    lambda p: p.m if p.ragged == "m" else p.k)  # the routed rows: wgrad's are its K
KINDS: dict[str, ProblemKind] = {k.name: k for k in (DENSE, GROUPED)}


def kind_named(name: str) -> ProblemKind:
    """ProblemError for a name not in KINDS."""
    try:
        return KINDS[name]
    except KeyError:
        raise ProblemError(f"unknown problem kind {name!r}; known: {', '.join(KINDS)}") from None


def kind_of(problem) -> ProblemKind:
    """The kind of a GemmProblem or GroupedProblem."""
    for kind in KINDS.values():
        if isinstance(problem, kind.problem_type):
            return kind
    raise TypeError(f"not a GEMM problem: {type(problem).__name__}")
