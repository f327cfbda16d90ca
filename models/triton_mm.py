"""One Inductor Triton mm config per M range, for the GEMMs cutetune leaves to Inductor.

A GEMM too small to cover a quack launch's host time stays with Inductor; where it is also
memory-bound, Inductor's Triton mm template runs the step faster than ATen (its launch costs
less host time, and it takes the pointwise epilogue: data/bench/step_h200.json). Reduced mode
benchmarks the template's configs; predicted mode may not, so it needs one config chosen in
advance. The data are Inductor's own timings of ATen and every Triton config it offers per
shape (scripts/triton_mm_sweep.py). Inductor sizes BLOCK_M from next_pow2(M) (at least 16), so
the configs it offers depend on M only through that bucket: one pick per (operand majors,
bucket, narrow or wide N), the config with the best geomean over the group's shapes, relative
to each shape's fastest Triton config. Narrow N (at most NARROW_N) is split off because its
output has too few column tiles to fill the GPU with the tiles that suit wide N (how the picks
fare on model families they were not fitted on: scripts/triton_mm_report.py). There are no
per-shape entries: the group picks are what steps on the H200 were timed with
(predicted-heldout in data/bench/step_h200_triton.json).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

# Inductor's kwargs that name a Triton mm config (the rest follow from dtype and shape).
CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_stages", "num_warps")
ConfigKey = tuple[int, ...]  # values of CONFIG_KEYS, in that order
# N up to this is "narrow": even 32-wide tiles give at most 64 columns, half an H100/H200's SMs.
NARROW_N = 2048


@dataclass(frozen=True)
class SweepShape:
    """One shape's benchmark: ATen's time and each Triton config's, in ms."""

    m: int
    n: int
    k: int
    majors: str  # a_major + b_major: "kk" for nn.Linear (x @ W.t())
    aten_ms: float
    triton_ms: Mapping[ConfigKey, float]
    dtype: str = "bf16"
    device: str = "H200"


@dataclass(frozen=True)
class TritonPick:
    """A group's config, its geomean time over the group's shapes relative to each shape's
    fastest Triton config and to ATen (GPU time alone, without the host time it saves)."""

    majors: str
    m_bucket: int
    wide: bool  # N > NARROW_N
    config: ConfigKey
    vs_best_triton: float
    vs_aten: float
    shapes: int

    def kwargs(self) -> dict[str, int]:
        return dict(zip(CONFIG_KEYS, self.config))

    def to_json(self) -> dict:
        return {"majors": self.majors, "m_bucket": self.m_bucket, "wide": self.wide,
                "config": self.kwargs(),
                "vs_best_triton": self.vs_best_triton, "vs_aten": self.vs_aten,
                "shapes": self.shapes}

    @classmethod
    def from_json(cls, d: Mapping) -> "TritonPick":
        return cls(str(d["majors"]), int(d["m_bucket"]), bool(d["wide"]),
                   tuple(int(d["config"][k]) for k in CONFIG_KEYS), float(d["vs_best_triton"]),
                   float(d["vs_aten"]), int(d["shapes"]))


def m_bucket(m: int) -> int:
    """The M that Inductor sizes a Triton mm's BLOCK_M from: next power of two, at least 16."""
    return max(16, 1 << (max(m, 1) - 1).bit_length())


def load_sweep(path: str | os.PathLike) -> list[SweepShape]:
    """The shapes of a sweep file (JSON lines) that have an ATen time and Triton times; rows
    that recorded an error are skipped. ValueError names the file and line of a corrupt row."""
    shapes = []
    p = Path(path)
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if "error" in row:
                continue
            aten = [c["ms"] for c in row["choices"] if c["kind"] == "aten"]
            triton = {tuple(int(c["config"][k]) for k in CONFIG_KEYS): float(c["ms"])
                      for c in row["choices"] if c["kind"] == "triton"
                      and all(k in c.get("config", {}) for k in CONFIG_KEYS)}
            shape = SweepShape(int(row["m"]), int(row["n"]), int(row["k"]), str(row["majors"]),
                               float(min(aten)), {c: t for c, t in triton.items() if _timed(t)},
                               str(row["dtype"]), str(row["device"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"corrupt Triton sweep row {p}:{i}: {type(e).__name__}: {e}") from None
        if shape.triton_ms and _timed(shape.aten_ms):  # a failed choice's time is inf
            shapes.append(shape)
    return shapes


def _timed(ms: float) -> bool:
    return math.isfinite(ms) and ms > 0


def group_key(majors: str, m: int, n: int) -> tuple[str, int, bool]:
    """The group a shape's pick is fitted in: operand majors, M bucket, wide N."""
    return majors, m_bucket(m), n > NARROW_N


def fit(shapes: Iterable[SweepShape]) -> list[TritonPick]:
    """Per group (``group_key``): the config offered for every shape of the group with the
    best geomean of its time over each shape's fastest Triton time."""
    from cutetune.models.evaluate import geomean  # (scipy: not for compile-time lookups)

    groups: dict[tuple[str, int, bool], list[SweepShape]] = {}
    for s in shapes:
        groups.setdefault(group_key(s.majors, s.m, s.n), []).append(s)
    picks = []
    for (majors, bucket, wide), group in sorted(groups.items()):
        common = set.intersection(*(set(s.triton_ms) for s in group))
        if not common:
            continue
        score = {c: geomean([s.triton_ms[c] / min(s.triton_ms.values()) for s in group])
                 for c in common}
        best = min(sorted(common), key=score.__getitem__)
        picks.append(TritonPick(majors, bucket, wide, best, score[best],
                                geomean([s.triton_ms[best] / s.aten_ms for s in group]),
                                len(group)))
    return picks


def holdout(shapes: list[SweepShape], group_of: Callable[[SweepShape], str]) -> list[dict]:
    """Each shape timed with the pick fitted without its group (e.g. its model family): its
    pick's time relative to its fastest Triton config, to ATen, and to the fastest of all
    (max-autotune's choice)."""
    out = []
    for g in sorted({group_of(s) for s in shapes}):
        picks = TritonTable.from_sweep([s for s in shapes if group_of(s) != g]).picks
        for s in (s for s in shapes if group_of(s) == g):
            p = picks.get(group_key(s.majors, s.m, s.n))
            if p is None or p.config not in s.triton_ms:
                continue
            t = s.triton_ms[p.config]
            best_triton = min(s.triton_ms.values())
            out.append({"group": g, "m": s.m, "n": s.n, "k": s.k, "majors": s.majors,
                        "config": p.kwargs(), "vs_best_triton": t / best_triton,
                        "vs_aten": t / s.aten_ms, "vs_best": t / min(best_triton, s.aten_ms)})
    return out


class TritonTable:
    """``config(majors, m, n)``: Inductor's Triton mm kwargs to use without benchmarking, or
    None for ATen: the shape's group pick (``fit``) where that beat ATen's GPU time in geomean
    over the group's shapes (the template also costs less host time); a group without
    measurements, ATen."""

    def __init__(self, picks: Iterable[TritonPick]) -> None:
        self.picks = {(p.majors, p.m_bucket, p.wide): p for p in picks}

    @classmethod
    def from_sweep(cls, shapes: list[SweepShape]) -> "TritonTable":
        return cls(fit(shapes))

    def config(self, majors: str, m: int, n: int) -> dict[str, int] | None:
        p = self.picks.get(group_key(majors, m, n))
        return p.kwargs() if p is not None and p.vs_aten < 1.0 else None

    def to_json(self) -> dict:
        return {"config_keys": list(CONFIG_KEYS),
                "picks": [p.to_json() for p in self.picks.values()]}

    @classmethod
    def from_json(cls, d: Mapping) -> "TritonTable":
        """ValueError when the table is malformed or keyed by other config kwargs."""
        try:
            if tuple(d["config_keys"]) != CONFIG_KEYS:
                raise ValueError(f"Triton config keys {d['config_keys']} differ from "
                                 f"{list(CONFIG_KEYS)}")
            return cls([TritonPick.from_json(p) for p in d["picks"]])
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed Triton table: {type(e).__name__}: {e}") from None
