"""The held-out replay of the heuristics file against its model (``models.file_heldout``) on a
hand-made fixture whose every ratio is worked out below."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cutetune.models.data import Measurements
from cutetune.models.dataset import CONFIG_COLUMNS
from cutetune.models.file_heldout import Replay, replay, summarize
from cutetune.models.heuristics import Grid
from cutetune.space.enumerate import enumerate_configs
from cutetune.space.problem import GemmProblem, GroupedProblem, layout_name

GRID = Grid(m=(16, 256), n=(256,), k=(256,))
MS = (16, 48, 128, 256)  # cells: 16 (itself), 16, 256, 256 (itself)
# measured ms of configs X and Y, and cuBLAS's, per problem
TIMES = {16: (1.0, 2.0, 1.5), 48: (2.0, 1.0, 1.2), 128: (1.0, 1.1, 0.9), 256: (1.0, 1.0, 1.0)}


def _configs():
    common = set.intersection(*(set(enumerate_configs("sm90", GemmProblem(m, 256, 256)))
                                for m in MS))
    return sorted(common, key=lambda c: c.short())[:2]


X, Y = _configs()


class ShapeModel:
    """Ranks X first up to M 32, Y first above; prefers cuBLAS from M 200."""

    def rank(self, problem, configs=None, top_k=None):
        order = [X, Y] if problem.m <= 32 else [Y, X]
        return [(c, 1.0) for c in order if c in configs][:top_k]

    def prefers_cublas(self, problem, configs=None):
        return problem.m >= 200


def _data(batch: int = 1) -> Measurements:
    problems = tuple(GemmProblem(m, 256, 256, batch) for m in MS)
    cols = {c: np.array([getattr(cfg, c) for _ in MS for cfg in (X, Y)]) for c in CONFIG_COLUMNS}
    return Measurements(cols, np.array([t for m in MS for t in TIMES[m][:2]]),
                        np.repeat(np.arange(len(MS)), 2), problems,
                        np.array(["s"] * len(MS), dtype=object),
                        np.array([TIMES[m][2] for m in MS]), np.zeros(len(MS), bool), "H200")


def test_replay_scores_the_files_cell_answer_against_the_models():
    data, seen = _data(), []
    splits = [(np.array([2, 3]), np.array([0, 1])), (np.array([0, 1]), np.array([2, 3]))]

    def train_fold(sub):
        seen.append({p.m for p in sub.problems})
        return ShapeModel()

    rep = replay(data, train_fold, splits, GRID)
    assert seen == [{128, 256}, {16, 48}]  # each fold's model never saw its test problems
    # M 48: the model picks Y (1.0), the file its cell's (M 16) pick X (2.0)
    np.testing.assert_allclose(rep.model_ms, [1.0, 1.0, 1.1, 1.0])
    np.testing.assert_allclose(rep.file_ms, [1.0, 2.0, 1.1, 1.0])
    np.testing.assert_allclose(rep.best_ms, [1.0, 1.0, 1.0, 1.0])
    # M 128: the file answers for its cell (M 256), where the model prefers cuBLAS
    assert rep.model_aten.tolist() == [False, False, False, True]
    assert rep.file_aten.tolist() == [False, False, True, True]
    assert rep.on_grid.tolist() == [True, False, False, True]
    s = summarize(rep)
    assert s["file_top1_vs_model"] == pytest.approx(0.5 ** 0.25)
    assert s["file_top1_vs_model_min"] == pytest.approx(0.5)
    assert s["model_top1_vs_best"] == pytest.approx((1 / 1.1) ** 0.25)  # M 128: Y, not X
    # oracle min(model top-1, cuBLAS): 1.0, 1.0, 0.9, 1.0; decisions: file 1, 2, 0.9, 1 and
    # model 1, 1, 1.1, 1
    assert s["file"]["decision_vs_oracle"] == pytest.approx(0.5 ** 0.25)
    assert s["file"]["decision_vs_oracle_min"] == pytest.approx(0.5)
    assert s["model"]["decision_vs_oracle"] == pytest.approx((0.9 / 1.1) ** 0.25)
    assert s["model"]["below_min_target"] == 1 and s["file"]["below_min_target"] == 1
    assert (s["file"]["keeps_cublas"], s["model"]["keeps_cublas"]) == (2, 1)
    assert s["file_meets"] == {"file_top1_vs_model": False, "decision_vs_oracle": False,
                               "decision_vs_oracle_min": False}
    assert rep.layouts == ("kk",) * 4 and "by_layout" not in s  # one layout: no breakdown
    assert s["oracle_vs_cublas"] == pytest.approx(math.prod([1.5, 1.2, 1.0, 1.0]) ** 0.25)


def test_a_file_that_answers_as_its_model_meets_the_targets():
    """Every problem on the grid: the file's answers are the model's."""
    data = _data()
    grid = Grid(m=MS, n=(256,), k=(256,))
    rep = replay(data, lambda sub: ShapeModel(), [(np.array([2, 3]), np.array([0, 1])),
                                                    (np.array([0, 1]), np.array([2, 3]))], grid)
    s = summarize(rep)
    assert s["file_top1_vs_model"] == 1.0 and s["on_grid"] == 4
    assert s["file"] == s["model"]


def test_a_grid_without_batched_cells_prefers_cublas_for_a_batched_problem():
    """As the file's lookup does: the model still decides, the file keeps cuBLAS."""
    rep = replay(_data(batch=2), lambda sub: ShapeModel(),
                 [(np.array([2, 3]), np.array([0, 1])), (np.array([0, 1]), np.array([2, 3]))],
                 GRID)
    assert rep.model_aten.tolist() == [False, False, False, True]
    assert rep.file_aten.tolist() == [True] * 4
    assert rep.layouts == ("kk bmm",) * 4
    batched = replay(_data(batch=2), lambda sub: ShapeModel(),
                     [(np.array([2, 3]), np.array([0, 1])), (np.array([0, 1]), np.array([2, 3]))],
                     Grid(batch=(1, 2), m=(16, 256), n=(256,), k=(256,)))
    assert batched.file_aten.tolist() == [False, False, True, True]  # its cells answer


def test_summary_per_layout_scores_each_layouts_problems_alone():
    """Two kk problems the file answers as the model does, two mn ones where it loses 2x."""
    f = np.array
    rep = Replay(("a", "b", "c", "d"), model_ms=f([1.0, 1.0, 1.0, 1.0]),
                 model_aten=f([False] * 4), file_ms=f([1.0, 1.0, 2.0, 2.0]),
                 file_aten=f([False] * 4), cublas_ms=f([2.0, 2.0, 4.0, 4.0]),
                 on_grid=f([True, True, False, False]), layouts=("kk", "kk", "mn", "mn"),
                 best_ms=f([1.0, 0.5, 1.0, 1.0]))
    s = summarize(rep)
    kk, mn = s["by_layout"]["kk"], s["by_layout"]["mn"]
    assert kk["problems"] == mn["problems"] == 2
    assert kk["file_top1_vs_model"] == 1.0 and mn["file_top1_vs_model"] == pytest.approx(0.5)
    assert mn["file"]["decision_vs_cublas"] == pytest.approx(2.0)
    assert mn["model"]["decision_vs_cublas"] == pytest.approx(4.0)
    assert s["file_top1_vs_model"] == pytest.approx(0.5 ** 0.5)  # the whole set: both
    assert kk["model_top1_vs_best"] == pytest.approx(0.5 ** 0.5) and mn["model_top1_vs_best"] == 1.0


def test_layout_name_reads_a_then_b_and_marks_batched_problems():
    assert layout_name(GemmProblem(64, 64, 64, a_major="k", b_major="n")) == "kn"
    assert layout_name(GemmProblem(64, 64, 64, batch=4, a_major="m", b_major="n")) == "mn bmm"
    assert layout_name(GroupedProblem(8, 64, 64, 1024, gemm="wgrad")) == "mn"  # its majors
