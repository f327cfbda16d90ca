"""One Inductor Triton mm config per M range, for the GEMMs cutetune leaves to Inductor, and
when a graph's such GEMMs should take it.

A GEMM too small to cover a quack launch's host time stays with Inductor; where it is also
memory-bound, Inductor's Triton mm template can run the step faster than ATen: its launch
costs the host less and it takes the pointwise epilogue (data/bench/step_h200.json.gz). Reduced
mode benchmarks the template's configs; predicted mode may not, so it needs one config chosen in
advance. The configs come from Inductor's own timings of every Triton config it offers per
shape (scripts/triton_mm_sweep.py). Inductor sizes BLOCK_M from next_pow2(M) (at least 16), so
the configs it offers depend on M only through that bucket: one pick per (operand majors,
bucket, narrow or wide N), the config with the best geomean over the group's shapes, relative
to each shape's fastest Triton config. Narrow N (at most NARROW_N) is split off because its
output has too few column tiles to fill the GPU with the tiles that suit wide N (how the picks
fare on model families they were not fitted on: scripts/triton_mm_report.py).

A shape that was retimed L2-cold (scripts/triton_mm_retime.py: the pick and the sweep's
fastest configs, data/inputs/triton_mm/h200_bf16_retimed_top4.jsonl) takes the config that ran it
fastest there instead; the sweep's own timings are too rough to choose per shape.

Whether to take a Triton config is a question of the whole step, not of one GEMM. Timed
alone, L2-cold, the picks run longer on the GPU than ATen on most shapes; the step gains only
while it stays host-bound. ``LaunchCosts`` models a step as taking the longer of its host time
(launches times their host cost, from step benchmarks) and its GPU time (fitted to the retimed
shapes), and gives the Triton picks to those of a graph's GEMMs that keep its step nearest
the best over the spread of host speeds seen.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import statistics
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from ..space.device import device_for
from ..space.features import ceiling_times_s, ideal_time_s
from ..space.problem import GemmProblem

# Inductor's kwargs that name a Triton mm config (the rest follow from dtype and shape).
CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_stages", "num_warps")
ConfigKey = tuple[int, ...]  # values of CONFIG_KEYS, in that order
PROBLEM_FIELDS = tuple(f.name for f in fields(GemmProblem))
# a retimed variant that timed a quack config carries it under this key (``models.gpu_times``)
QUACK_CONFIG = "quack_config"
# N up to this is "narrow": even 32-wide tiles give at most 64 columns, half an H100/H200's SMs.
NARROW_N = 2048
# The largest M whose step times say how fast the host issues launches: the Triton table serves
# M buckets up to 256 (scripts/triton_mm_sweep.py), and from M=1024 the benchmark's steps are
# GPU-bound, their host time the launch queue filling up (data/bench/step_h200.json.gz: per-launch
# host times up to 2.4x the median).
STEP_HOST_MAX_M = 256


# Host time of one quack GEMM in a compiled step without CUDA graphs: the default step's host
# time per GEMM plus what each quack GEMM added to the same step timed beside it in one process,
# the larger of two H200 measurements: 25.2 + 15.8 us with two quack GEMMs of four at M=1
# (data/bench/step_ab_h200_predicted_attn_m1.json), 37.0 + 10.7 us at M=1024
# (data/bench/step_ab_h200_all_modes_m1024.json, where the quack kernels that Inductor's
# benchmark picked made the step 14 % slower). A GEMM that cannot take longer than this on the
# GPU gains nothing from a faster kernel where the step is host-bound, and loses the launch's
# extra host time. Those launches went through quack's Python path; launched from its TVM-FFI
# library a quack GEMM costs compiled code about what ATen's extern call does (-0.5 to +5.6
# us), 9-12 us more than a Triton template's (data/bench/launch_probe_h200*.json.gz). So below
# this size the choice stays the launch costs' one between templates and ATen: quack's GPU
# gain over cuBLAS there (at most 2.4 us on the probed shapes) cannot pay for a template's
# cheaper launch where the step waits on the host, and ATen matches its host cost.
QUACK_LAUNCH_HOST_US = 48.0


def host_bound(problem: GemmProblem, host_bound_us: float) -> tuple[float, bool] | None:
    """(time at the device's ceiling in us, whether memory-bound) when even that ceiling runs
    ``problem`` in under ``host_bound_us``; else None."""
    compute_s, memory_s = ceiling_times_s(problem, device_for(problem.arch))
    ideal_us = max(compute_s, memory_s) * 1e6
    return (ideal_us, memory_s >= compute_s) if ideal_us < host_bound_us else None


def config_key(kwargs: Mapping[str, int]) -> ConfigKey:
    """The ConfigKey of Inductor's Triton mm kwargs (KeyError when one is missing)."""
    return tuple(int(kwargs[k]) for k in CONFIG_KEYS)


@dataclass(frozen=True)
class SweepShape:
    """One shape's benchmark: each Triton config's time and ATen's, in ms (None where the
    benchmark held no ATen choice: reduced mode's, where the launch costs chose Triton)."""

    m: int
    n: int
    k: int
    majors: str  # a_major + b_major: "kk" for nn.Linear (x @ W.t())
    aten_ms: float | None
    triton_ms: Mapping[ConfigKey, float]
    dtype: str = "bf16"
    device: str = "H200"


@dataclass(frozen=True)
class TritonPick:
    """A group's config and its geomean time over the group's shapes relative to each shape's
    fastest Triton config."""

    majors: str
    m_bucket: int
    wide: bool  # N > NARROW_N
    config: ConfigKey
    vs_best_triton: float
    shapes: int

    def kwargs(self) -> dict[str, int]:
        return dict(zip(CONFIG_KEYS, self.config))

    def to_json(self) -> dict:
        return {"majors": self.majors, "m_bucket": self.m_bucket, "wide": self.wide,
                "config": self.kwargs(),
                "vs_best_triton": self.vs_best_triton, "shapes": self.shapes}

    @classmethod
    def from_json(cls, d: Mapping) -> "TritonPick":
        return cls(str(d["majors"]), int(d["m_bucket"]), bool(d["wide"]),
                   config_key(d["config"]), float(d["vs_best_triton"]),
                   int(d["shapes"]))


def m_bucket(m: int) -> int:
    """The M that Inductor sizes a Triton mm's BLOCK_M from: next power of two, at least 16."""
    return max(16, 1 << (max(m, 1) - 1).bit_length())


def _read_rows(path: str | os.PathLike, what: str, parse: Callable[[dict], object]) -> list:
    """``parse(row)`` of each JSON line of ``path`` (gzip-compressed where it ends in .gz)
    that recorded no error, where it returns something. ValueError names the file and line of
    a corrupt row."""
    out = []
    p = Path(path)
    try:
        text = gzip.decompress(p.read_bytes()).decode() if p.suffix == ".gz" else p.read_text()
    except (EOFError, gzip.BadGzipFile, UnicodeDecodeError) as e:
        raise ValueError(f"corrupt {what} file {p}: {type(e).__name__}: {e}") from None
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise TypeError(f"a JSON object expected, not {type(row).__name__}")
            item = None if "error" in row else parse(row)
        except (json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"corrupt {what} row {p}:{i}: {type(e).__name__}: {e}") from None
        if item is not None:
            out.append(item)
    return out


def load_sweep(path: str | os.PathLike) -> list[SweepShape]:
    """The shapes of a sweep file (JSON lines) with Triton times; rows that recorded an
    error are skipped, and so are choices that failed (their time is inf). ValueError names
    the file and line of a corrupt row."""
    def parse(row: dict) -> SweepShape | None:
        aten = [float(c["ms"]) for c in row["choices"] if c["kind"] == "aten"
                and _timed(float(c["ms"]))]
        triton = {config_key(c["config"]): float(c["ms"])
                  for c in row["choices"] if c["kind"] == "triton"
                  and all(k in c.get("config", {}) for k in CONFIG_KEYS)}
        shape = SweepShape(int(row["m"]), int(row["n"]), int(row["k"]), str(row["majors"]),
                           min(aten, default=None),
                           {c: t for c, t in triton.items() if _timed(t)},
                           str(row["dtype"]), str(row["device"]))
        return shape if shape.triton_ms else None

    return _read_rows(path, "Triton sweep", parse)


def _timed(ms: float) -> bool:
    return math.isfinite(ms) and ms > 0


def group_key(majors: str, m: int, n: int) -> tuple[str, int, bool]:
    """The group a shape's pick is fitted in: operand majors, M bucket, wide N."""
    return majors, m_bucket(m), n > NARROW_N


def fit(shapes: Iterable[SweepShape]) -> list[TritonPick]:
    """Per group (``group_key``): the config offered for every shape of the group with the
    best geomean of its time over each shape's fastest Triton time."""
    from .evaluate import geomean  # (scipy: not for compile-time lookups)

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
        picks.append(TritonPick(majors, bucket, wide, best, score[best], len(group)))
    return picks


def holdout(shapes: list[SweepShape], group_of: Callable[[SweepShape], str]) -> list[dict]:
    """Each shape timed with the pick fitted without its group (e.g. its model family): its
    pick's time relative to its fastest Triton config, by the sweep's timings (which of
    Inductor's configs to take; ATen's sweep times are not compared: see the module doc)."""
    out = []
    for g in sorted({group_of(s) for s in shapes}):
        picks = TritonTable.from_sweep([s for s in shapes if group_of(s) != g]).picks
        for s in (s for s in shapes if group_of(s) == g):
            p = picks.get(group_key(s.majors, s.m, s.n))
            if p is None or p.config not in s.triton_ms:
                continue
            out.append({"group": g, "m": s.m, "n": s.n, "k": s.k, "majors": s.majors,
                        "config": p.kwargs(),
                        "vs_best_triton": s.triton_ms[p.config] / min(s.triton_ms.values())})
    return out


@dataclass(frozen=True)
class RetimedShape:
    """One shape's GPU times in us, L2-cold (scripts/triton_mm_retime.py): ATen's and one
    Triton config's (``config``), timed in the same rounds; ``variant`` says which config it
    was ("pick": its group's pick; "sweep_best", "sweep_2", ...: the sweep's fastest)."""

    problem: GemmProblem
    config: ConfigKey
    aten_us: float
    triton_us: float
    variant: str = "pick"


def load_retimed(path: str | os.PathLike) -> list[RetimedShape]:
    """Each Triton config timed beside ATen in a retime file (JSON lines), one RetimedShape
    apiece (quack configs timed beside them are ``models.gpu_times``'); rows that recorded an
    error, or timed no ATen, are skipped, and so are configs without a time (not finite and positive: a failed run). ValueError names the file and
    line of a corrupt row."""
    def parse(row: dict) -> list[RetimedShape] | None:
        timed = row.get("timed", {})
        aten_ms = float(timed["aten"]["ms"]) if "aten" in timed else math.inf
        if not _timed(aten_ms):
            return None
        majors = str(row["majors"])
        problem = GemmProblem(int(row["m"]), int(row["n"]), int(row["k"]), 1, str(row["dtype"]),
                              str(row["dtype"]), majors[0], majors[1],
                              device_for(str(row["device"])).arch)
        return [RetimedShape(problem, config_key(t["config"]), aten_ms * 1e3,
                             float(t["ms"]) * 1e3, name)
                for name, t in timed.items()
                if name != "aten" and QUACK_CONFIG not in t and _timed(float(t["ms"]))
                ] or None

    return [r for rows in _read_rows(path, "retime", parse) for r in rows]


def fastest_retimed(retimed: Iterable[RetimedShape]) -> dict[GemmProblem, RetimedShape]:
    """Per retimed problem, the row of the Triton config that ran it fastest."""
    fastest: dict[GemmProblem, RetimedShape] = {}
    for r in retimed:
        if r.problem not in fastest or r.triton_us < fastest[r.problem].triton_us:
            fastest[r.problem] = r
    return fastest


def gpu_features(problem: GemmProblem, config: ConfigKey) -> list[float]:
    """What a memory-bound GEMM's GPU time follows, in us: [1, its time at the device's
    ceiling, K/1000 over the share of SMs the config's output tiles occupy (the serial K loop
    of each tile, drawn out where few tiles share the GPU: Inductor's template has no
    split-K)]. Linear in these, the GPU times of each model family, fitted without it, come
    within 6 % (ATen) and 16 % (the picks) in root-mean-square log error
    (``gpu_time_model_heldout_family`` in data/reports/triton_mm_h200_bf16.json.gz)."""
    device = device_for(problem.arch)
    tiles = (problem.batch * math.ceil(problem.m / config[0]) * math.ceil(problem.n / config[1]))
    return [1.0, ideal_time_s(problem, device) * 1e6,
            problem.k / 1000 / min(1.0, tiles / device.sm_count)]


GPU_FEATURES = ("1", "ceiling us", "K/1000 / SM share")


@dataclass(frozen=True)
class LaunchCosts:
    """A step's time as the longer of its host time and its GPU time, for a graph's
    host-bound mm run each on ATen or on its Triton config: host time per launch
    (``step_host_us``), scaled by how fast the host runs, and GPU time per GEMM: as retimed
    where ``measured`` holds the shape with that config, else coef . ``gpu_features`` and no
    less than the ceiling's (``fit_launch_costs``). The model's error (16 % for the picks)
    exceeds the GPU time many configs add to ATen's (under 1 % for Llama-3-8B's gate and up
    projections at M 16 and 128 with their fastest configs,
    data/inputs/triton_mm/h200_bf16_retimed_top4.jsonl), so it decides only shapes that were not
    measured.

    How fast the host runs is not known when a graph compiles: the same graph's step host time
    differed by up to 2x between H200 machines and between processes on one (the step files
    ``step_host_us`` reads). ``host_factors`` is that spread, relative to the median; the
    choice (``triton_problems``) is the one whose step is nearest the best over the whole
    spread, in the worst case. Bounding it instead by the split a GPU-timing autotuner would
    pick (each mm on its GPU-faster kernel: 1df8a4d) lost 1.27x on a slow host, where
    max-autotune, whose benchmark times ATen slow, had put every mm in a template
    (data/inputs/steps/step_h200_bounded4.json): max-autotune takes either split between runs, so
    the best split is the one to stay near."""

    aten_host_us: float
    triton_host_us: float
    aten_coef: tuple[float, ...]
    triton_coef: tuple[float, ...]
    host_factors: tuple[float, float] = (1.0, 1.0)
    measured: tuple[RetimedShape, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "_measured", {(r.problem, r.config): (r.aten_us, r.triton_us)
                                               for r in self.measured})
        object.__setattr__(self, "_fastest", {p: r.config for p, r in
                                              fastest_retimed(self.measured).items()})

    def fastest_config(self, problem: GemmProblem) -> ConfigKey | None:
        """The Triton config that ran ``problem`` fastest where it was retimed, else None."""
        return self._fastest.get(problem)

    def gpu_us(self, problem: GemmProblem, config: ConfigKey, triton: bool) -> float:
        hit = self._measured.get((problem, config))
        if hit is not None:
            return hit[triton]
        coef = self.triton_coef if triton else self.aten_coef
        x = gpu_features(problem, config)
        return max(x[1], sum(c * v for c, v in zip(coef, x)))

    def host_gpu_us(self, gemms: Sequence[tuple[GemmProblem, ConfigKey]],
                    triton: Sequence[bool]) -> tuple[float, float]:
        """Host and GPU time of ``gemms``, each on its Triton pick where ``triton`` says so."""
        host = sum(self.triton_host_us if t else self.aten_host_us for t in triton)
        return host, sum(self.gpu_us(p, c, t) for (p, c), t in zip(gemms, triton))

    def step_us(self, gemms: Sequence[tuple[GemmProblem, ConfigKey]], triton: Sequence[bool],
                host_factor: float = 1.0) -> float:
        host, gpu = self.host_gpu_us(gemms, triton)
        return max(host * host_factor, gpu)

    def triton_problems(self, gemms: Sequence[tuple[GemmProblem, ConfigKey]]
                        ) -> frozenset[GemmProblem]:
        """The problems among ``gemms`` (one per node; a problem keeps one choice for all its
        nodes) that should take their Triton config. Each takes host time off the step and
        adds GPU time, so the candidates are those taking the problems in order of the GPU time
        each node adds, none to all; of them, the one with the least worst-case ratio to the
        best candidate's step over ``host_factors`` (ties: fewer Triton problems)."""
        return self._weigh(gemms)[0]

    def least_regret(self, gemms: Sequence[tuple[GemmProblem, ConfigKey]]) -> float:
        """That worst-case ratio for ``triton_problems``' choice: how much slower than the
        best choice for its host the modelled step may run on some host speed in
        ``host_factors`` (1.0: one choice is best on all of them)."""
        return self._weigh(gemms)[1]

    def _weigh(self, gemms: Sequence[tuple[GemmProblem, ConfigKey]]
               ) -> tuple[frozenset[GemmProblem], float]:
        if not gemms:
            return frozenset(), 1.0
        penalty: dict[GemmProblem, float] = {}
        for p, c in gemms:
            penalty[p] = self.gpu_us(p, c, True) - self.gpu_us(p, c, False)
        order = sorted(penalty, key=penalty.__getitem__)
        takers = [frozenset(order[:j]) for j in range(len(order) + 1)]
        lo, hi = self.host_factors
        factors = [lo * (hi / lo) ** (i / 8) for i in range(9)]
        sums = [self.host_gpu_us(gemms, [p in s for p, _ in gemms]) for s in takers]
        steps = [[max(host * f, gpu) for f in factors] for host, gpu in sums]
        best = [min(col) for col in zip(*steps)]
        regret = [max(t / b for t, b in zip(row, best)) for row in steps]
        j = min(range(len(takers)), key=lambda j: (round(regret[j], 9), j))
        return takers[j], regret[j]

    def to_json(self) -> dict:
        return {"aten_host_us": self.aten_host_us, "triton_host_us": self.triton_host_us,
                "aten_coef": list(self.aten_coef), "triton_coef": list(self.triton_coef),
                "host_factors": list(self.host_factors),
                "measured": [{**r.problem.to_dict(), "config": list(r.config),
                              "aten_us": r.aten_us, "triton_us": r.triton_us,
                              "variant": r.variant} for r in self.measured]}

    @classmethod
    def from_json(cls, d: Mapping) -> "LaunchCosts":
        n = len(GPU_FEATURES)
        coefs = [tuple(float(x) for x in d[k]) for k in ("aten_coef", "triton_coef")]
        if any(len(c) != n for c in coefs):
            raise ValueError(f"launch-cost coefficients need {n} values each ({GPU_FEATURES})")
        if not all(math.isfinite(x) for c in coefs for x in c):
            raise ValueError("launch-cost coefficients are not all finite")
        lo, hi = (float(x) for x in d["host_factors"])
        if not 0 < lo <= hi < math.inf:
            raise ValueError(f"host factors {d['host_factors']} are not 0 < low <= high")
        host = float(d["aten_host_us"]), float(d["triton_host_us"])
        measured = tuple(RetimedShape(GemmProblem(**{f: r[f] for f in PROBLEM_FIELDS}),
                                      tuple(int(x) for x in r["config"]),
                                      float(r["aten_us"]), float(r["triton_us"]),
                                      str(r["variant"]))
                         for r in d["measured"])
        for r in measured:
            if len(r.config) != len(CONFIG_KEYS):
                raise ValueError(f"measured config {list(r.config)} needs {len(CONFIG_KEYS)} "
                                 f"values ({', '.join(CONFIG_KEYS)})")
            if not (_timed(r.aten_us) and _timed(r.triton_us)):
                raise ValueError(f"measured times of {r.problem.key()} are not positive")
        if not all(_timed(x) for x in host):
            raise ValueError(f"host costs {list(host)} are not positive")
        return cls(*host, *coefs, (lo, hi), measured)


def fit_launch_costs(retimed: Sequence[RetimedShape], host: "StepHostCosts") -> LaunchCosts:
    """Least squares of GPU time (us, the unit a step sums) on ``gpu_features``, one fit for
    ATen (once per shape, with its pick's tiles: the config an unmeasured shape is asked
    about), one for every Triton config retimed, kept beside the measurements; host costs as
    ``step_host_us`` found them."""
    import numpy as np

    picks = [r for r in retimed if r.variant == "pick"]
    if len(picks) <= len(GPU_FEATURES):
        raise ValueError(f"{len(picks)} shapes retimed with their pick cannot fit "
                         f"{len(GPU_FEATURES)} coefficients")

    def lstsq(rows: Sequence[RetimedShape], y: Callable[[RetimedShape], float]) -> tuple:
        x = np.array([gpu_features(r.problem, r.config) for r in rows])
        return tuple(float(c) for c in np.linalg.lstsq(x, np.array([y(r) for r in rows]),
                                                       rcond=None)[0])

    return LaunchCosts(host.aten_us, host.triton_us, lstsq(picks, lambda r: r.aten_us),
                       lstsq(retimed, lambda r: r.triton_us), host.factors, tuple(retimed))


@dataclass(frozen=True)
class StepHostCosts:
    """Host time per GEMM launch in compiled steps (ATen's, a Triton template's), medians,
    and the spread of the observations around them (lowest and highest ratio to the median
    of their workload and kind)."""

    aten_us: float
    triton_us: float
    factors: tuple[float, float]


def check_step_report(report: Mapping) -> None:
    """ValueError unless every part of a step_ab.py report says which modes Dynamo compiled
    again when timed: reports written before it did (2026-11-30) timed every mode but the last
    on code compiled again, so their host times may be the default's code."""
    for part in report["parts"]:
        for name, w in part["workloads"].items():
            if "graphs_compiled_when_timed" not in w:
                raise ValueError(f"part M={part['m']} ({name}) has no graphs_compiled_when_timed:"
                                 " written before step_ab.py kept each mode's own compiled "
                                 "code, its host times may be the default's")


def step_host_us(reports: Iterable[Mapping]) -> StepHostCosts:
    """Host costs from step benchmarks (``scripts/step_ab.py --report`` files): every compiled
    mode that ran all of a workload's GEMMs on ATen, or all in Triton templates, gives its
    host time divided by the GEMM count. The host time includes the step's other launches (an
    epilogue ATen cannot fuse), so it is what a GEMM costs a step, not a bare launch. The
    spread is taken per workload and kind, so that a graph with more launches per GEMM does
    not count as a slower host. A mode the report does not count, or that ran code compiled
    again when timed, says nothing of its kernels; a step above ``STEP_HOST_MAX_M`` nothing
    of the host."""
    seen: dict[tuple[str, str], list[float]] = {}
    for report in reports:
        check_step_report(report)
        dropped = set(report.get("not_counted", {}).get("modes", ()))
        for part in report["parts"]:
            if part["m"] > STEP_HOST_MAX_M:
                continue
            for name, w in part["workloads"].items():
                again = w["graphs_compiled_when_timed"]
                for mode, k in w["kernels"].items():
                    if mode in dropped or again.get(mode, 0):
                        continue
                    n = k["aten"] + k["triton_template"] + k["quack"]
                    kind = ("aten" if n and k["aten"] == n else
                            "triton" if n and k["triton_template"] == n else None)
                    if kind:
                        seen.setdefault((name, kind), []).append(w["host_us"][mode] / n)
    if not any(kind == "aten" for _, kind in seen) or not any(
            kind == "triton" for _, kind in seen):
        raise ValueError("no step benchmark ran a workload on ATen alone and one on Triton "
                         "templates alone")
    ratios = [x / statistics.median(xs) for xs in seen.values() for x in xs]
    return StepHostCosts(*(statistics.median(x for (_, kind), xs in seen.items()
                                             for x in xs if kind == want)
                           for want in ("aten", "triton")), (min(ratios), max(ratios)))


class TritonTable:
    """``config(problem)``: Inductor's Triton mm kwargs for a plain mm: the config that ran it
    fastest where the launch costs hold its retime (a recorded problem), else its group pick
    (``fit``; not with ``measured_only``), or None for a group without measurements;
    ``triton_problems(gemms)``: which of a graph's host-bound mm with those configs should
    take them (``LaunchCosts``; never without launch costs)."""

    def __init__(self, picks: Iterable[TritonPick], costs: LaunchCosts | None = None) -> None:
        self.picks = {(p.majors, p.m_bucket, p.wide): p for p in picks}
        self.costs = costs

    @classmethod
    def from_sweep(cls, shapes: list[SweepShape], costs: LaunchCosts | None = None
                   ) -> "TritonTable":
        return cls(fit(shapes), costs)

    def config(self, problem: GemmProblem, measured_only: bool = False
               ) -> dict[str, int] | None:
        fastest = self.costs.fastest_config(problem) if self.costs is not None else None
        if fastest is not None:
            return dict(zip(CONFIG_KEYS, fastest))
        if measured_only:
            return None
        p = self.picks.get(group_key(problem.a_major + problem.b_major, problem.m, problem.n))
        return p.kwargs() if p is not None else None

    def triton_problems(self, gemms: Sequence[tuple[GemmProblem, Mapping[str, int]]]
                        ) -> frozenset[GemmProblem]:
        if self.costs is None:
            return frozenset()
        return self.costs.triton_problems([(p, config_key(c)) for p, c in gemms])

    def to_json(self) -> dict:
        return {"config_keys": list(CONFIG_KEYS),
                "picks": [p.to_json() for p in self.picks.values()],
                **({"launch_costs": self.costs.to_json()} if self.costs else {})}

    @classmethod
    def from_json(cls, d: Mapping) -> "TritonTable":
        """ValueError when the table is malformed or keyed by other config kwargs."""
        try:
            if tuple(d["config_keys"]) != CONFIG_KEYS:
                raise ValueError(f"Triton config keys {d['config_keys']} differ from "
                                 f"{list(CONFIG_KEYS)}")
            costs = LaunchCosts.from_json(d["launch_costs"]) if "launch_costs" in d else None
            return cls([TritonPick.from_json(p) for p in d["picks"]], costs)
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed Triton table: {type(e).__name__}: {e}") from None
