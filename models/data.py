"""The training view of a measurement dataset: ok quack rows grouped by problem, plus the
ATen baseline's time of each problem.

A grouped problem measured under several routings of its rows (``expert_counts``) is one
problem per routing: its configs are timed on different work. They share a shape
(``shapes``), which cross-validation keeps in one fold (``folds``): the host cannot tell them
apart, so a model must not be scored on one having trained on the other. Dense problems of
one size in several layouts share a shape too.

Rows are sorted by problem so that a problem is one contiguous run (what ranking objectives
and the evaluation expect). Failed rows (compile errors, timeouts, ...) carry no time and are
left out; they are counted so a report can say how many there were. A view holds one kind of
problem (``kinds``): a dataset of dense and grouped rows is read one kind at a time.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .dataset import CONFIG_COLUMNS, DatasetError, load, parts, problem_identity, problem_of
from .evaluate import group_kfold
from .kinds import KINDS, ProblemKind, kind_named, kind_of
from ..space.enumerate import enumerate_configs
from ..space.problem import GemmProblem, GroupedProblem

SWEEP_SUFFIX = "_exhaustive"  # space.suites names full sweeps of a family "<family>_exhaustive"


def family_of(suite: str) -> str:
    """The model family of a suite: a full sweep of a family's layers is still that family, so
    holding a family out must hold out its sweep too."""
    return suite.removesuffix(SWEEP_SUFFIX)


@dataclass(frozen=True)
class Measurements:
    """ok quack rows (sorted by problem) and per-problem facts, of problems of one kind.

    cols: problem and config columns of each row, as numpy arrays (what the feature pipeline
    reads). group: problem index of each row. problems/suites/cublas_ms/swept: one entry per
    problem; cublas_ms is the time of the kind's ATen baseline (torch.mm's cuBLAS, or
    torch._grouped_mm), nan where it was not measured ok; swept is True where every valid
    config of the problem was measured (ok or not), so its best is the space's best.
    """

    cols: dict[str, np.ndarray]
    time_ms: np.ndarray
    group: np.ndarray
    problems: tuple[GemmProblem, ...] | tuple[GroupedProblem, ...]
    suites: np.ndarray
    cublas_ms: np.ndarray
    swept: np.ndarray
    device_name: str
    failed_rows: int = 0
    shapes: np.ndarray | None = None  # per problem: its shape's index (None: one each)
    routings: np.ndarray | None = None  # per grouped problem: its expert_counts (JSON text)

    @property
    def n_problems(self) -> int:
        return len(self.problems)

    @property
    def families(self) -> np.ndarray:
        return np.array([family_of(s) for s in self.suites], dtype=object)

    @property
    def kind(self) -> ProblemKind:
        return kind_of(self.problems[0])

    @property
    def m(self) -> np.ndarray:
        """The size that buckets each problem (``ProblemKind.size``: M, or the routed rows)."""
        return np.array([self.kind.size(p) for p in self.problems])

    def folds(self, k: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
        """``evaluate.group_kfold`` over the problems, a shape's routings in one fold."""
        return group_kfold(self.n_problems, k, seed, self.shapes)

    def rows_of(self, problem_idx: np.ndarray) -> np.ndarray:
        """Row indices of the given problems, in problem order."""
        return np.flatnonzero(np.isin(self.group, problem_idx))

    def unlike(self, problems) -> np.ndarray:
        """Indices of this data's problems that share no layer (``layer_key``) with
        ``problems``: what a fit may take from another dtype's data while ``problems`` are
        held out."""
        held = {layer_key(p) for p in problems}
        return np.array([i for i, p in enumerate(self.problems) if layer_key(p) not in held],
                        dtype=int)

    def joined(self, other: "Measurements") -> "Measurements":
        """This data's problems, then ``other``'s (dense timings of the same device in another
        dtype), as one training set: the rows a fit reads. It has no shapes or routings, which
        only folds read."""
        check_joinable(self, other)
        if not other.problems:
            return self
        return Measurements(
            cols={k: np.concatenate([v, other.cols[k]]) for k, v in self.cols.items()},
            time_ms=np.concatenate([self.time_ms, other.time_ms]),
            group=np.concatenate([self.group, other.group + self.n_problems]),
            problems=self.problems + other.problems,
            suites=np.concatenate([self.suites, other.suites]),
            cublas_ms=np.concatenate([self.cublas_ms, other.cublas_ms]),
            swept=np.concatenate([self.swept, other.swept]), device_name=self.device_name,
            failed_rows=self.failed_rows + other.failed_rows)

    def subset(self, problem_idx: np.ndarray) -> "Measurements":
        """The measurements of some problems, renumbered 0..len-1 in the given (sorted) order."""
        problem_idx = np.sort(np.asarray(problem_idx))
        rows = self.rows_of(problem_idx)
        renum = np.full(self.n_problems, -1)
        renum[problem_idx] = np.arange(len(problem_idx))
        return Measurements(
            cols={k: v[rows] for k, v in self.cols.items()}, time_ms=self.time_ms[rows],
            group=renum[self.group[rows]], problems=tuple(self.problems[i] for i in problem_idx),
            suites=self.suites[problem_idx], cublas_ms=self.cublas_ms[problem_idx],
            swept=self.swept[problem_idx], device_name=self.device_name, failed_rows=0,
            shapes=None if self.shapes is None else self.shapes[problem_idx],
            routings=None if self.routings is None else self.routings[problem_idx])


def _numpy(table: pa.Table, name: str) -> np.ndarray:
    col = table.column(name)
    if pa.types.is_string(col.type):
        return np.asarray(col.to_pylist(), dtype=object)
    return col.to_numpy(zero_copy_only=False)


def of_kind(table: pa.Table, kind: str | None = None) -> tuple[ProblemKind, pa.Table]:
    """The rows of the dataset's problems of one kind: ``kind`` ("dense" or "grouped"), else
    the only kind the dataset holds. DatasetError when it holds both and ``kind`` is None, or
    none of ``kind``: a cost model ranks one kind of problem."""
    grouped = pc.is_valid(table.column("experts"))
    masks = {"dense": pc.invert(grouped), "grouped": grouped}
    problems = {k: len(set(table.filter(m).column("problem_key").to_pylist()))
                for k, m in masks.items()}
    held = " and ".join(f"{n} {k}" for k, n in problems.items() if n) or "no"
    if kind is None:
        present = [k for k, n in problems.items() if n]
        if len(present) > 1:
            raise DatasetError(f"the dataset holds {held} problems; a cost model ranks one kind: "
                               f"choose it (cutetune train --kind dense, or --kind grouped)")
        kind = present[0] if present else "dense"
    elif not problems[kind_named(kind).name]:
        raise DatasetError(f"the dataset holds no {kind} problems ({held} problems)")
    return KINDS[kind], table.filter(masks[kind])


def from_table(table: pa.Table, kind: str | None = None) -> Measurements:
    """Build Measurements from a dataset table (``cutetune.models.dataset.load``), of its
    problems of ``kind`` (see ``of_kind``)."""
    kind, table = of_kind(table, kind)
    devices = sorted(set(table.column("device_name").drop_null().to_pylist()))
    if len(devices) != 1:
        raise DatasetError(f"a cost model trains on one device's timings; the dataset has "
                           f"{devices or 'no device name'}")
    # an ok row without a time (null: not measured) has nothing to train on
    ok = pc.and_(pc.equal(table.column("status"), "ok"), pc.is_valid(table.column("time_ms")))
    quack = table.filter(pc.and_(ok, pc.equal(table.column("backend"), "quack")))
    failed = table.filter(pc.and_(pc.invert(ok), pc.equal(table.column("backend"), "quack")))
    baseline = table.filter(pc.and_(ok, pc.equal(table.column("backend"),
                                                 kind.baseline_backend)))
    if quack.num_rows == 0:
        raise DatasetError("the dataset has no ok quack rows to train on")
    # A config measured more than once (e.g. a re-run) counts once, at its median time.
    keys = _identities(quack)
    pair = np.char.add(np.char.add(keys, "|"), _numpy(quack, "config_key").astype(str))
    _, inverse = np.unique(pair, return_inverse=True)
    time_ms = _numpy(quack, "time_ms").astype(float)
    by_pair = np.lexsort((time_ms, inverse))
    counts = np.bincount(inverse)
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    t_sorted = time_ms[by_pair]
    med = 0.5 * (t_sorted[starts + (counts - 1) // 2] + t_sorted[starts + counts // 2])
    rows = by_pair[starts]
    order = np.argsort(keys[rows], kind="stable")
    rows, med = rows[order], med[order]
    keys = keys[rows]

    problem_keys, group = np.unique(keys, return_inverse=True)
    cols = {c: _numpy(quack, c)[rows] for c in kind.problem_columns + CONFIG_COLUMNS}
    first_row = np.searchsorted(keys, problem_keys)
    problems = tuple(problem_of({c: cols[c][r] for c in kind.problem_columns})
                     for r in first_row)
    suites = _numpy(quack, "suite")[rows][first_row]
    shape_keys = np.array([_shape(p) for p in problems])
    routings = _numpy(quack, "expert_counts")[rows][first_row]
    suites = np.array([s if s else "unknown" for s in suites], dtype=object)

    cub = dict(zip(_identities(baseline), _numpy(baseline, "time_ms").astype(float)))
    cublas_ms = np.array([cub.get(k, np.nan) for k in problem_keys])
    tried = table.filter(pc.equal(table.column("backend"), "quack"))
    n_tried = Counter(k for k, _ in set(zip(_identities(tried).tolist(),
                                            _numpy(tried, "config_key").tolist())))
    swept = np.array([n_tried.get(k, 0) >= len(enumerate_configs(p.arch, p))
                      for k, p in zip(problem_keys, problems)])
    _, shapes = np.unique(shape_keys, return_inverse=True)
    return Measurements(cols=cols, time_ms=med, group=group, problems=problems, suites=suites,
                        cublas_ms=cublas_ms, swept=swept, device_name=devices[0],
                        failed_rows=failed.num_rows,
                        shapes=shapes if len(set(shapes)) < len(shapes) else None,
                        routings=routings if kind.name == "grouped" else None)


def check_joinable(data: Measurements, other: Measurements) -> None:
    """ValueError unless ``other`` may join ``data``'s fits: dense problems of one arch, timed
    on one device, in other dtypes (the same problem twice would weigh double)."""
    if not other.problems:
        return
    if (data.kind.name, other.kind.name) != ("dense", "dense"):
        raise ValueError("only dense measurements join another dataset's")
    both = {p.dtype for p in data.problems} & {p.dtype for p in other.problems}
    if both:
        raise ValueError(f"the joined measurements must be of another dtype; both hold "
                         f"{', '.join(sorted(both))}")
    archs = {p.arch for p in data.problems + other.problems}
    if len(archs) > 1 or other.device_name != data.device_name:
        raise ValueError(f"measurements of {other.device_name} ({', '.join(sorted(archs))}) "
                         f"cannot join those of {data.device_name}: a model learns one device's "
                         f"timings")


def layer_key(p: GemmProblem) -> tuple[int, ...]:
    """A dense problem's batch and sizes in ascending order: one layer's GEMMs share it in every
    layout (its gradients take the forward's M, N and K in another order) and dtype."""
    return (p.batch, *sorted((p.m, p.n, p.k)))


def with_extra(data: Measurements, X: np.ndarray, extra: tuple[Measurements, np.ndarray],
               held_out=(), held_families=()) -> tuple[Measurements, np.ndarray]:
    """``data`` and its feature rows, joined by ``extra``'s (measurements, feature rows) less
    its problems of a layer among ``held_out``'s and of ``held_families``: a fit's training set."""
    other, other_X = extra
    keep = other.unlike(held_out)
    keep = keep[~np.isin(other.families[keep], list(held_families))]
    return data.joined(other.subset(keep)), np.vstack([X, other_X[other.rows_of(keep)]])


def _shape(p: GemmProblem | GroupedProblem) -> str:
    """What cross-validation keeps in one fold: a grouped problem's key (its routings), a
    dense problem's sizes and dtypes (its layouts)."""
    if isinstance(p, GroupedProblem):
        return p.key()
    return f"{p.arch}:{p.dtype}->{p.out_dtype}:b{p.batch}:m{p.m}:n{p.n}:k{p.k}"


def _identities(table: pa.Table) -> np.ndarray:
    """Each row's ``problem_identity``."""
    return np.array([problem_identity(k, r) for k, r in zip(_numpy(table, "problem_key"),
                                                             _numpy(table, "expert_counts"))],
                    dtype=str)


def load_measurements(path: str | os.PathLike, kind: str | None = None) -> Measurements:
    return from_table(load(path), kind)


def dataset_sha256(path: str | os.PathLike) -> str:
    """Digest of the dataset's parts (names and bytes, in sorted order): the artifact records it
    so a model can be traced to the exact data it was trained on."""
    h = hashlib.sha256()
    for f in parts(path):
        h.update(Path(f).name.encode() + b"\0")
        h.update(Path(f).read_bytes())
    return h.hexdigest()
