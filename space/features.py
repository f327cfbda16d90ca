"""Derived features of (problem, config) rows: pure, vectorized numpy over columns.

One code path serves the tuner (every valid config of one problem, ~2400 rows, in a few ms so
a model can rank the whole space per problem) and training (a whole dataset at once), so the
model sees exactly the features at tuning time that it was trained on.

Everything is computed in the kernel's orientation. With swap_ab the kernel computes
D^T = B^T A^T: its "M" (the extent tile_m tiles and cluster_m spans) is the problem's N, and
its A operand is the problem's B. On sm100 an even cluster_m with tile_m 128/256 selects the
2-CTA MMA: the pair splits tile_m, so one CTA owns tile_m/2 rows (quack's cta_tile_shape_m).

Traffic is modelled L2 -> SM, without cache reuse: A is read once per column of CTA tiles and
B once per row, and TMA multicast in a cluster divides A's reads by cluster_n and B's by
cluster_m (on sm100 the 2-CTA pair splitting B counts the same way). The model learns what
L2 reuse recovers; the footprint-over-L2 feature tells it when that is a lot.

Grouped GEMMs (``GroupedProblem``) have features of their own (``GROUPED_FEATURE_NAMES``),
from what the host knows: the experts and the ragged total, not how the rows split. Those of
a balanced routing are the dense features of a batched GEMM, a batch per active expert with
the ragged dimension split evenly (``balanced_*``); the bounds over every routing (each active
expert's last block partial, or none) frame them.
"""

from __future__ import annotations

from dataclasses import fields
from operator import attrgetter
from typing import Callable, Mapping, Sequence

import numpy as np

from .config import KernelConfig
from .device import DeviceSpec
from .problem import DTYPE_BYTES, GROUPED_GEMMS, GemmProblem, GroupedProblem
from .rules import pipeline_stages, tile_k

CONFIG_FIELDS = tuple(f.name for f in fields(KernelConfig))
PROBLEM_FIELDS = ("m", "n", "k", "batch")
RAW_NAMES = PROBLEM_FIELDS + CONFIG_FIELDS
DERIVED_NAMES = (
    # problem
    "in_bytes", "out_bytes", "a_m_major", "b_n_major",
    "log2_m", "log2_n", "log2_k", "log2_batch", "log2_flops", "log2_kernel_m", "log2_kernel_n",
    # CTA tiles and waves
    "cluster_size", "two_cta", "cta_tile_m", "tiles_m", "tiles_n", "work_units",
    "log2_work_units", "active_ctas", "waves", "waves_ceil", "last_wave_occupancy",
    "wave_efficiency", "pad_waste_m", "pad_waste_n", "pad_waste",
    # main loop
    "k_iters", "log2_k_iters", "stages", "pipeline_depth",
    # traffic and intensity
    "log2_bytes_moved", "traffic_over_min", "multicast_saving", "log2_ai_problem",
    "log2_ai_traffic", "ai_cta", "log2_footprint_over_l2",
    # roofline
    "roofline_s", "log2_roofline_s", "log2_mem_over_compute", "log2_ideal_s",
    "log2_roofline_over_ideal",
)
FEATURE_NAMES = RAW_NAMES + DERIVED_NAMES

SPLIT_K_PARTIAL_BYTES = 4  # quack's split-K commits fp32 partials to a workspace
_TWO_CTA_TILE_M = (128, 256)
_POSITIVE = PROBLEM_FIELDS + ("tile_m", "tile_n", "cluster_m", "cluster_n", "split_k")


def config_columns(configs: Sequence[KernelConfig]) -> dict[str, np.ndarray]:
    """The configs' fields as int64 columns (booleans as 0/1), in KernelConfig field order."""
    get = attrgetter(*CONFIG_FIELDS)
    table = np.array([get(c) for c in configs], dtype=np.int64).reshape(-1, len(CONFIG_FIELDS))
    return {name: table[:, j] for j, name in enumerate(CONFIG_FIELDS)}


def problem_columns(problem: GemmProblem, n: int) -> dict[str, np.ndarray]:
    """``problem`` broadcast to ``n`` rows, with the dataset's column names."""
    cols = {f: np.full(n, getattr(problem, f), dtype=np.int64) for f in PROBLEM_FIELDS}
    for f in ("dtype", "out_dtype", "a_major", "b_major", "arch"):
        cols[f] = np.full(n, getattr(problem, f))
    return cols


def derived_features(cols: Mapping[str, np.ndarray], device: DeviceSpec) -> dict[str, np.ndarray]:
    """The DERIVED_NAMES features of each row of ``cols``, as float64 columns.

    ``cols`` holds m, n, k, batch and the KernelConfig fields; dtype and out_dtype (names,
    bf16 when absent), a_major and b_major ("k" when absent) and arch (checked against
    ``device``) are optional. Raises ValueError naming the first bad column.
    """
    return _derived(_raw(cols), cols, device)


def feature_matrix(cols: Mapping[str, np.ndarray], device: DeviceSpec) -> np.ndarray:
    """float32 (rows, len(FEATURE_NAMES)): the raw columns, then the derived features."""
    raw = _raw(cols)
    return _matrix(FEATURE_NAMES, raw, _derived(raw, cols, device))


def _matrix(names: Sequence[str], raw: dict, derived: dict) -> np.ndarray:
    """float32 (rows, len(names)) of the named raw or derived columns."""
    x = np.empty((len(names), len(raw["m"])), dtype=np.float32)
    for j, name in enumerate(names):
        x[j] = raw[name] if name in raw else derived[name]
    return np.ascontiguousarray(x.T)  # row-major, as sklearn and xgboost want it


def problem_feature_matrix(problem: GemmProblem, configs: Sequence[KernelConfig],
                           device: DeviceSpec) -> np.ndarray:
    """Features of ``problem`` under each of ``configs`` on ``device`` (one row per config)."""
    cols = {**config_columns(configs), **problem_columns(problem, len(configs))}
    return feature_matrix(cols, device)


def ceiling_times_s(problem: GemmProblem, device: DeviceSpec) -> tuple[float, float]:
    """(compute, memory): the problem's time at the device's compute ceiling and at its memory
    ceiling (operands read and output written once)."""
    b, m, n, k = problem.batch, problem.m, problem.n, problem.k
    min_bytes = b * ((m * k + k * n) * DTYPE_BYTES[problem.dtype]
                     + m * n * DTYPE_BYTES[problem.out_dtype])
    return _ceilings(2.0 * b * m * n * k, min_bytes, device.peak_flops(problem.dtype), device)


def ideal_time_s(problem: GemmProblem, device: DeviceSpec) -> float:
    """The problem's time at whichever ceiling binds: no kernel runs it faster."""
    return float(max(ceiling_times_s(problem, device)))


def _ceilings(flops, min_bytes, peak, device: DeviceSpec):
    return flops / peak, min_bytes / device.mem_bw_bytes_per_s


def _derived(raw: dict[str, np.ndarray], cols: Mapping[str, np.ndarray],
             device: DeviceSpec) -> dict[str, np.ndarray]:
    m, n, k, batch = (raw[f] for f in PROBLEM_FIELDS)
    tile_m, tile_n, cluster_m, cluster_n, split_k = (
        raw[f] for f in ("tile_m", "tile_n", "cluster_m", "cluster_n", "split_k"))
    swap = raw["swap_ab"] != 0
    _check_arch(cols, device)
    in_dtype = _strings(cols, "dtype", "bf16")
    out_dtype = _strings(cols, "out_dtype", "bf16")
    in_bytes = _per_value(in_dtype, _dtype_bytes).astype(np.float64)
    out_bytes = _per_value(out_dtype, _dtype_bytes).astype(np.float64)
    tk = _per_value(in_dtype, tile_k)
    peak = _per_value(in_dtype, device.peak_flops)

    cluster_size = cluster_m * cluster_n
    too_big = cluster_size > device.max_cluster_size
    if too_big.any():
        raise ValueError(f"cluster of {cluster_size[too_big].max()} CTAs exceeds {device.name}'s "
                         f"maximum of {device.max_cluster_size}")

    # Kernel orientation (see the module docstring).
    km, kn = np.where(swap, n, m), np.where(swap, m, n)
    two_cta = ((device.arch == "sm100") & np.isin(tile_m, _TWO_CTA_TILE_M)
               & (cluster_m % 2 == 0))
    cta_m = np.where(two_cta, tile_m // 2, tile_m)
    # quack's schedulers launch whole clusters: CTA tile counts round up to cluster multiples,
    # and the padded CTAs take an SM slot like any other.
    tiles_m = _ceil_div(_ceil_div(km, cta_m), cluster_m) * cluster_m
    tiles_n = _ceil_div(_ceil_div(kn, tile_n), cluster_n) * cluster_n
    work_units = tiles_m * tiles_n * batch * split_k
    clusters = work_units // cluster_size
    # Persistent kernels: one CTA per SM, whole clusters only.
    max_clusters = device.sm_count // cluster_size
    waves = clusters / max_clusters
    waves_ceil = _ceil_div(clusters, max_clusters)
    last_wave = (clusters - (waves_ceil - 1) * max_clusters) / max_clusters
    pad_m = 1.0 - km / (tiles_m * cta_m)
    pad_n = 1.0 - kn / (tiles_n * tile_n)

    k_iters = _ceil_div(_ceil_div(k, tk), split_k)  # the largest split's K tiles
    stages = _stages(tile_m, tile_n, in_dtype, out_dtype, device.arch)

    mf, nf, kf, bf = (x.astype(np.float64) for x in (m, n, k, batch))
    kmf, knf = np.where(swap, nf, mf), np.where(swap, mf, nf)
    a_plain = bf * kmf * kf * in_bytes * tiles_n
    b_plain = bf * knf * kf * in_bytes * tiles_m
    a_bytes, b_bytes = a_plain / cluster_n, b_plain / cluster_m
    d_bytes = bf * mf * nf * out_bytes
    # Non-final splits commit an fp32 partial tile that is read back once.
    partial_bytes = 2.0 * (split_k - 1) * bf * mf * nf * SPLIT_K_PARTIAL_BYTES
    bytes_moved = a_bytes + b_bytes + d_bytes + partial_bytes
    min_bytes = bf * (mf * kf + kf * nf) * in_bytes + d_bytes
    flops = 2.0 * mf * nf * kf * bf

    # Compute time: whole waves of padded tiles, each CTA at its SM's share of the peak.
    tile_flops = 2.0 * cta_m * tile_n * k_iters * tk
    t_compute = waves_ceil * tile_flops * device.sm_count / peak
    t_memory = bytes_moved / device.mem_bw_bytes_per_s
    roofline = np.maximum(t_compute, t_memory)
    ideal = np.maximum(*_ceilings(flops, min_bytes, peak, device))

    out = {
        "in_bytes": in_bytes, "out_bytes": out_bytes,
        "a_m_major": _flag(cols, "a_major", "m", "k"),
        "b_n_major": _flag(cols, "b_major", "n", "k"),
        "log2_m": np.log2(mf), "log2_n": np.log2(nf), "log2_k": np.log2(kf),
        "log2_batch": np.log2(bf), "log2_flops": np.log2(flops),
        "log2_kernel_m": np.log2(kmf), "log2_kernel_n": np.log2(knf),
        "cluster_size": cluster_size, "two_cta": two_cta, "cta_tile_m": cta_m,
        "tiles_m": tiles_m, "tiles_n": tiles_n, "work_units": work_units,
        "log2_work_units": np.log2(work_units), "active_ctas": max_clusters * cluster_size,
        "waves": waves, "waves_ceil": waves_ceil, "last_wave_occupancy": last_wave,
        "wave_efficiency": waves / waves_ceil, "pad_waste_m": pad_m, "pad_waste_n": pad_n,
        "pad_waste": 1.0 - (1.0 - pad_m) * (1.0 - pad_n),
        "k_iters": k_iters, "log2_k_iters": np.log2(k_iters), "stages": stages,
        "pipeline_depth": np.minimum(stages, k_iters),
        "log2_bytes_moved": np.log2(bytes_moved), "traffic_over_min": bytes_moved / min_bytes,
        "multicast_saving": 1.0 - (a_bytes + b_bytes) / (a_plain + b_plain),
        "log2_ai_problem": np.log2(flops / min_bytes),
        "log2_ai_traffic": np.log2(flops / bytes_moved),
        "ai_cta": 2.0 * cta_m * tile_n / ((cta_m + tile_n) * in_bytes),
        "log2_footprint_over_l2": np.log2(min_bytes / device.l2_bytes),
        "roofline_s": roofline, "log2_roofline_s": np.log2(roofline),
        "log2_mem_over_compute": np.log2(t_memory / t_compute),
        "log2_ideal_s": np.log2(ideal), "log2_roofline_over_ideal": np.log2(roofline / ideal),
    }
    rows = (len(m),)  # columns uniform over the rows (e.g. the dtype) come out length 1
    return {name: np.broadcast_to(np.asarray(out[name], dtype=np.float64), rows).copy()
            for name in DERIVED_NAMES}


# ---------------------------------------------------------------- grouped GEMMs
GROUPED_PROBLEM_FIELDS = ("experts", "m", "n", "k")
GROUPED_RAW_NAMES = GROUPED_PROBLEM_FIELDS + CONFIG_FIELDS
GROUPED_OWN_NAMES = (
    "varlen_k", "log2_experts", "log2_ragged", "rows_per_expert", "log2_rows_per_expert",
    "active_experts", "tiles_per_expert", "ragged_block", "ragged_tiles_min",
    "ragged_tiles_max", "work_units_min", "work_units_max", "waves_min", "waves_max",
    "log2_ideal_s",
)
BALANCED_NAMES = tuple(f"balanced_{name}" for name in DERIVED_NAMES)
GROUPED_DERIVED_NAMES = GROUPED_OWN_NAMES + BALANCED_NAMES
GROUPED_FEATURE_NAMES = GROUPED_RAW_NAMES + GROUPED_DERIVED_NAMES
_GROUPED_POSITIVE = GROUPED_PROBLEM_FIELDS + _POSITIVE[len(PROBLEM_FIELDS):]


def grouped_problem_columns(problem: GroupedProblem, n: int) -> dict[str, np.ndarray]:
    """``problem`` broadcast to ``n`` rows, with its field names as columns."""
    cols = {f: np.full(n, getattr(problem, f), dtype=np.int64) for f in GROUPED_PROBLEM_FIELDS}
    for f in ("gemm", "dtype", "out_dtype", "arch"):
        cols[f] = np.full(n, getattr(problem, f))
    return cols


def grouped_derived_features(cols: Mapping[str, np.ndarray],
                             device: DeviceSpec) -> dict[str, np.ndarray]:
    """The GROUPED_DERIVED_NAMES features of each row of ``cols``, as float64 columns.

    ``cols`` holds experts, m, n, k, gemm (a GROUPED_GEMMS name) and the KernelConfig fields;
    dtype, out_dtype and arch as for ``derived_features``. Raises ValueError naming the first
    bad column."""
    return _grouped_derived(_raw(cols, GROUPED_RAW_NAMES, _GROUPED_POSITIVE), cols, device)


def grouped_feature_matrix(cols: Mapping[str, np.ndarray], device: DeviceSpec) -> np.ndarray:
    """float32 (rows, len(GROUPED_FEATURE_NAMES)): the raw columns, then the derived ones."""
    raw = _raw(cols, GROUPED_RAW_NAMES, _GROUPED_POSITIVE)
    return _matrix(GROUPED_FEATURE_NAMES, raw, _grouped_derived(raw, cols, device))


def grouped_problem_feature_matrix(problem: GroupedProblem, configs: Sequence[KernelConfig],
                                   device: DeviceSpec) -> np.ndarray:
    """Features of ``problem`` under each of ``configs`` on ``device`` (one row per config)."""
    cols = {**config_columns(configs), **grouped_problem_columns(problem, len(configs))}
    return grouped_feature_matrix(cols, device)


def grouped_ideal_time_s(problem: GroupedProblem, device: DeviceSpec) -> float:
    """The grouped problem's time at whichever ceiling binds, its operands moved once
    (``GroupedProblem.min_bytes``): no kernel runs it faster, however its rows are routed."""
    return float(max(_ceilings(float(problem.flops), problem.min_bytes,
                               device.peak_flops(problem.dtype), device)))


def _grouped_derived(raw: dict[str, np.ndarray], cols: Mapping[str, np.ndarray],
                     device: DeviceSpec) -> dict[str, np.ndarray]:
    experts, m, n, k = (raw[f] for f in GROUPED_PROBLEM_FIELDS)
    rows = len(m)
    if "gemm" not in cols:
        raise ValueError("feature columns missing: gemm")
    gemm = _strings(cols, "gemm", "")
    unknown = sorted(set(gemm.tolist()) - set(GROUPED_GEMMS))
    if unknown:
        raise ValueError(f"column 'gemm' must be one of {', '.join(GROUPED_GEMMS)}, "
                         f"got {unknown[0]!r}")
    spec = lambda j: lambda g: GROUPED_GEMMS[g][j]  # noqa: E731
    varlen_k = _per_value(gemm, spec(0)) == "k"
    # The balanced routing: the ragged total split evenly over the experts with work (varlen M
    # has at most one per row), as a batched dense GEMM of one batch per such expert.
    ragged = np.where(varlen_k, k, m)
    active = np.where(varlen_k, experts, np.minimum(experts, ragged))
    per_expert = _ceil_div(ragged, active)
    balanced_cols = {f: raw[f] for f in CONFIG_FIELDS}
    balanced_cols.update(m=np.where(varlen_k, m, per_expert), n=n, batch=active,
                         k=np.where(varlen_k, per_expert, k))
    for name, j in (("a_major", 1), ("b_major", 2)):
        balanced_cols[name] = np.broadcast_to(_per_value(gemm, spec(j)), (rows,))
    balanced_cols.update({f: cols[f] for f in ("dtype", "out_dtype", "arch") if f in cols})
    bal = _derived(_raw(balanced_cols), balanced_cols, device)

    # Bounds over every routing, in blocks of the ragged dimension: a varlen-M cluster's rows
    # (its clusters stay within one expert), or a K tile; each active expert's last block is
    # anywhere from full to one element (quack's VarlenMTileScheduler bounds its grid so).
    in_dtype = _strings(cols, "dtype", "bf16")
    block = np.where(varlen_k, _per_value(in_dtype, tile_k),
                     bal["cta_tile_m"].astype(np.int64) * raw["cluster_m"])
    blocks_min = _ceil_div(ragged, block)
    blocks_max = (ragged + active * (block - 1)) // block
    tiles_n = bal["tiles_n"].astype(np.int64)
    # Varlen K's work units are every expert's output tiles whatever the routing.
    work_min = np.where(varlen_k, bal["work_units"], blocks_min * raw["cluster_m"] * tiles_n)
    work_max = np.where(varlen_k, bal["work_units"], blocks_max * raw["cluster_m"] * tiles_n)
    cluster_size = raw["cluster_m"] * raw["cluster_n"]
    wave = (device.sm_count // cluster_size) * cluster_size  # CTAs of one full wave

    in_bytes, out_bytes = bal["in_bytes"], bal["out_bytes"]
    mf, nf, kf = (x.astype(np.float64) for x in (m, n, k))
    min_bytes = np.where(varlen_k, (mf * kf + kf * nf) * in_bytes + experts * mf * nf * out_bytes,
                         (mf * kf + active * kf * nf) * in_bytes + mf * nf * out_bytes)
    peak = _per_value(in_dtype, device.peak_flops)
    ideal = np.maximum(*_ceilings(2.0 * mf * nf * kf, min_bytes, peak, device))

    rows_per_expert = ragged / experts
    out = {
        "varlen_k": varlen_k, "log2_experts": np.log2(experts), "log2_ragged": np.log2(ragged),
        "rows_per_expert": rows_per_expert, "log2_rows_per_expert": np.log2(rows_per_expert),
        "active_experts": active / experts, "tiles_per_expert": bal["tiles_m"] * bal["tiles_n"],
        "ragged_block": block, "ragged_tiles_min": blocks_min, "ragged_tiles_max": blocks_max,
        "work_units_min": work_min, "work_units_max": work_max,
        "waves_min": work_min / wave, "waves_max": work_max / wave,
        "log2_ideal_s": np.log2(ideal),
        **{f"balanced_{name}": bal[name] for name in DERIVED_NAMES},
    }
    return {name: np.broadcast_to(np.asarray(out[name], dtype=np.float64), (rows,)).copy()
            for name in GROUPED_DERIVED_NAMES}


# ---------------------------------------------------------------- helpers
def _ceil_div(a: np.ndarray, b) -> np.ndarray:
    return -(-a // b)


def _raw(cols: Mapping[str, np.ndarray], names: Sequence[str] = RAW_NAMES,
         positive: Sequence[str] = _POSITIVE) -> dict[str, np.ndarray]:
    """The ``names`` columns (RAW_NAMES) as int64 (booleans as 0/1), checked: present, of one
    length, numeric without missing values, sizes (``positive``) positive."""
    missing = [f for f in names if f not in cols]
    if missing:
        raise ValueError(f"feature columns missing: {', '.join(missing)}")
    lengths = {f: len(cols[f]) for f in cols}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"feature columns differ in length: {lengths}")
    raw = {}
    for name in names:
        a = np.asarray(cols[name])
        if a.dtype.kind not in "biuf" or (a.dtype.kind == "f" and not np.isfinite(a).all()):
            # e.g. dataset rows of the cuBLAS baseline, which have no config
            raise ValueError(f"column {name!r} has missing or non-numeric values; "
                             f"filter out rows without a config (backend 'cublas') first")
        raw[name] = a = a.astype(np.int64, copy=False)
        if name in positive and a.size and a.min() < 1:
            raise ValueError(f"column {name!r} must be positive, got {a.min()}")
    return raw


def _strings(cols: Mapping[str, np.ndarray], name: str, default: str) -> np.ndarray:
    """String column ``name``, or ``default`` for every row when absent; length-1 when all rows
    agree, so per-value lookups run once (the tuner's single-problem case)."""
    a = np.asarray(cols[name]) if name in cols else np.array([default])
    if len(a) and (a == a[0]).all():
        return a[:1]
    return a


def _per_value(values: np.ndarray, fn: Callable) -> np.ndarray:
    """``fn`` applied once per distinct value of ``values``, mapped back onto the rows."""
    uniq, inverse = np.unique(values, return_inverse=True)
    return np.array([fn(str(u)) for u in uniq])[inverse]


def _dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}") from None


def _flag(cols, name: str, yes: str, no: str) -> np.ndarray:
    """1 where string column ``name`` is ``yes``, 0 where ``no`` (or the column is absent)."""
    a = _strings(cols, name, no)
    bad = (a != yes) & (a != no)
    if bad.any():
        raise ValueError(f"column {name!r} must be {yes!r} or {no!r}, got {a[bad][0]!r}")
    return a == yes


def _check_arch(cols, device: DeviceSpec) -> None:
    if "arch" in cols:
        arches = set(np.unique(np.asarray(cols["arch"])).tolist()) - {device.arch}
        if arches:
            raise ValueError(f"rows of arch {sorted(arches)} cannot be featurized for "
                             f"{device.name} ({device.arch}); split the rows by arch")


def _stages(tile_m, tile_n, in_dtype, out_dtype, arch: str) -> np.ndarray:
    """rules.pipeline_stages per row, calling it once per distinct (tile shape, dtypes).

    pipeline_stages reads only the tile shape of a config; tests check this vectorization
    against the scalar rule on every valid config, so a rule change cannot drift silently."""
    d_uniq, d_inv = np.unique(in_dtype, return_inverse=True)
    o_uniq, o_inv = np.unique(out_dtype, return_inverse=True)
    key = ((tile_m * 1024 + tile_n) * len(d_uniq) + d_inv) * len(o_uniq) + o_inv
    uniq, inverse = np.unique(key, return_inverse=True)
    values = []
    for u in uniq.tolist():
        u, o = divmod(u, len(o_uniq))
        shape, d = divmod(u, len(d_uniq))
        tm, tn = divmod(shape, 1024)
        c = KernelConfig(tile_m=tm, tile_n=tn)
        values.append(pipeline_stages(c, arch, str(d_uniq[d]), str(o_uniq[o])))
    return np.array(values, dtype=np.int64)[inverse]
