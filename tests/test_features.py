"""Derived features: hand-computed cases, orientation and 2-CTA semantics, agreement with the
scalar rules (and quack) on every valid config, and input errors."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from cutetune.space import GemmProblem, KernelConfig, enumerate_configs
from cutetune.space.device import B200, DEVICES, H100_SXM, H200, device_for
from cutetune.space.features import (CONFIG_FIELDS, DERIVED_NAMES, FEATURE_NAMES, RAW_NAMES,
    config_columns, derived_features, feature_matrix, problem_columns, problem_feature_matrix)
from cutetune.space.rules import pipeline_stages

SQUARE = GemmProblem(4096, 4096, 4096)


def feats(problem: GemmProblem, configs, device) -> dict[str, np.ndarray]:
    return derived_features({**config_columns(configs), **problem_columns(problem, len(configs))},
                            device)


def one(problem, config, device) -> dict[str, float]:
    return {k: float(v[0]) for k, v in feats(problem, [config], device).items()}


# ---------------------------------------------------------------- devices
@pytest.mark.parametrize("name,spec", [
    ("h200", H200), ("H200", H200), ("NVIDIA H200", H200), ("NVIDIA H100 80GB HBM3", H100_SXM),
    ("sm90", H200), ("sm100", B200), ("NVIDIA B200", B200), (" b200 ", B200),
])
def test_device_for(name, spec):
    assert device_for(name) is spec


@pytest.mark.parametrize("name", ["A100", "NVIDIA H100 PCIe", "sm80", ""])
def test_device_for_unknown_lists_known(name):
    with pytest.raises(ValueError, match="unknown device.*H200.*sm100"):
        device_for(name)


def test_device_specs():
    assert {d.arch for d in DEVICES.values()} == {"sm90", "sm100"}
    assert (H200.sm_count, B200.sm_count, H100_SXM.l2_bytes) == (132, 148, 50 * 2**20)
    assert H200.peak_flops("bf16") == 790e12
    with pytest.raises(ValueError, match="no peak rate for dtype 'fp32'"):
        H200.peak_flops("fp32")
    assert {H200, B200, H200} == {B200, H200}  # hashable (a cache key) despite the dict field


# ---------------------------------------------------------------- hand-computed
def test_square_128x256_cluster_2x1_on_h200():
    c = KernelConfig(tile_m=128, tile_n=256, pingpong=False, cluster_m=2, cluster_n=1)
    f = one(SQUARE, c, H200)
    assert (f["tiles_m"], f["tiles_n"], f["work_units"]) == (32, 16, 512)
    assert f["waves"] == pytest.approx(512 / 132)
    assert f["waves_ceil"] == 4
    assert f["last_wave_occupancy"] == pytest.approx((512 - 3 * 132) / 132)
    assert f["k_iters"] == 4096 / 64
    # (227 KiB - epilogue 2*64*32*2 - 1 KiB) // ((128 + 256) * 64 * 2) = 223232 // 49152
    assert f["stages"] == 4 == f["pipeline_depth"]
    assert (f["pad_waste_m"], f["pad_waste_n"], f["pad_waste"]) == (0, 0, 0)
    # A (32 MiB) read by 16 tile columns, B by 32 tile rows halved by the 2-CTA-row multicast,
    # plus D: (512 + 512 + 32) MiB against the 96 MiB minimum.
    assert f["traffic_over_min"] == pytest.approx(11)
    assert f["multicast_saving"] == pytest.approx(1 / 3)
    assert f["log2_bytes_moved"] == pytest.approx(math.log2(1056 * 2**20))
    assert f["ai_cta"] == pytest.approx(2 * 128 * 256 / (384 * 2))
    t_compute = 4 * (2 * 128 * 256 * 4096) * 132 / 790e12
    t_memory = 1056 * 2**20 / 4.3e12
    assert f["roofline_s"] == pytest.approx(max(t_compute, t_memory))
    assert f["log2_mem_over_compute"] == pytest.approx(math.log2(t_memory / t_compute))
    assert f["log2_ideal_s"] == pytest.approx(math.log2(2 * 4096**3 / 790e12))
    assert f["log2_flops"] == 37 and f["two_cta"] == 0 and f["active_ctas"] == 132


def test_padding_cluster_rounding_and_persistent_slots():
    # M=1000 on tile_m 128: 8 tiles cover 1024 rows; cluster_m 4 keeps 8 (a multiple of 4).
    p = GemmProblem(1000, 200, 512, batch=3)
    f = one(p, KernelConfig(128, 64, False, 4, 2), H200)
    assert f["tiles_m"] == 8 and f["pad_waste_m"] == pytest.approx(1 - 1000 / 1024)
    # N=200 on tile_n 64: 4 tiles; cluster_n 2 keeps 4.
    assert f["tiles_n"] == 4 and f["pad_waste_n"] == pytest.approx(1 - 200 / 256)
    assert f["work_units"] == 8 * 4 * 3
    assert f["active_ctas"] == (132 // 8) * 8  # whole clusters of 8: 16 of them
    # 3 tile rows round up to 4 with cluster_m 4 (the padded CTAs still take an SM).
    g = one(GemmProblem(384, 200, 512), KernelConfig(128, 64, False, 4, 1), H200)
    assert g["tiles_m"] == 4 and g["pad_waste_m"] == pytest.approx(0.25)


def test_split_k_multiplies_work_and_divides_k():
    p = GemmProblem(64, 256, 8192)
    base = KernelConfig(64, 128, True, 1, 1)
    f1, f4 = one(p, base, H200), one(p, replace(base, split_k=4), H200)
    assert f4["work_units"] == 4 * f1["work_units"]
    assert (f1["k_iters"], f4["k_iters"]) == (128, 32)
    assert f4["log2_bytes_moved"] > f1["log2_bytes_moved"]  # fp32 partials
    odd = one(GemmProblem(64, 256, 64 * 9), replace(base, split_k=2), H200)
    assert odd["k_iters"] == 5  # the larger split of 9 K tiles


# ---------------------------------------------------------------- semantics
def test_swap_ab_is_the_transposed_problem():
    """Config c with swap_ab on (M, N) runs the kernel c without swap runs on (N, M)."""
    p, q = GemmProblem(320, 4096, 2048), GemmProblem(4096, 320, 2048)
    configs = enumerate_configs("sm90", p)
    flipped = [replace(c, swap_ab=not c.swap_ab) for c in configs]
    fp, fq = feats(p, configs, H200), feats(q, flipped, H200)
    for name in set(DERIVED_NAMES) - {"log2_m", "log2_n"}:
        np.testing.assert_allclose(fp[name], fq[name], rtol=1e-12, err_msg=name)
    swapped = np.array([c.swap_ab for c in configs])
    np.testing.assert_array_equal(fp["log2_kernel_m"], np.where(swapped, 12, np.log2(320)))


def test_sm100_two_cta_halves_the_cta_tile():
    pair = one(GemmProblem(4096, 4096, 4096, arch="sm100"),
               KernelConfig(256, 128, False, 2, 1), B200)
    assert pair["two_cta"] == 1 and pair["cta_tile_m"] == 128 and pair["tiles_m"] == 32
    solo = one(GemmProblem(4096, 4096, 4096, arch="sm100"),
               KernelConfig(128, 128, False, 1, 2), B200)
    assert solo["two_cta"] == 0 and solo["cta_tile_m"] == 128
    # sm90 never pairs CTAs, whatever the cluster.
    assert one(SQUARE, KernelConfig(128, 128, False, 2, 1), H200)["cta_tile_m"] == 128


def test_cta_tile_m_matches_quack_on_every_valid_sm100_config():
    from quack.gemm_config import cta_tile_shape_m

    configs = enumerate_configs("sm100")
    f = feats(GemmProblem(2048, 2048, 2048, arch="sm100"), configs, B200)
    want = [cta_tile_shape_m(c.tile_m, c.cluster_m, 10) for c in configs]
    np.testing.assert_array_equal(f["cta_tile_m"], want)
    assert f["two_cta"].any() and not f["two_cta"].all()


@pytest.mark.parametrize("arch,device", [("sm90", H200), ("sm100", B200)])
@pytest.mark.parametrize("dtype,out_dtype", [("bf16", "bf16"), ("fp16", "bf16")])
def test_stages_match_the_scalar_rule_on_every_valid_config(arch, device, dtype, out_dtype):
    p = GemmProblem(512, 512, 4096, dtype=dtype, out_dtype=out_dtype, arch=arch)
    configs = enumerate_configs(arch)
    want = [pipeline_stages(c, arch, dtype, out_dtype) for c in configs]
    np.testing.assert_array_equal(feats(p, configs, device)["stages"], want)


@pytest.mark.parametrize("arch,device", [("sm90", H200), ("sm100", B200)])
@pytest.mark.parametrize("shape", [dict(m=4096, n=4096, k=4096), dict(m=16, n=8192, k=8192),
                                   dict(m=1000, n=24, k=64, batch=5, a_major="m", b_major="n")])
def test_all_valid_configs_finite_and_sane(arch, device, shape):
    p = GemmProblem(**shape, arch=arch)
    configs = enumerate_configs(arch, p)
    x = problem_feature_matrix(p, configs, device)
    assert x.shape == (len(configs), len(FEATURE_NAMES)) and x.dtype == np.float32
    assert x.flags["C_CONTIGUOUS"] and np.isfinite(x).all()
    col = {name: x[:, j] for j, name in enumerate(FEATURE_NAMES)}
    np.testing.assert_array_equal(col["tile_n"], [c.tile_n for c in configs])  # row order
    assert (col["waves_ceil"] >= col["waves"]).all()
    assert ((col["last_wave_occupancy"] > 0) & (col["last_wave_occupancy"] <= 1)).all()
    assert ((col["wave_efficiency"] > 0) & (col["wave_efficiency"] <= 1)).all()
    for w in ("pad_waste_m", "pad_waste_n", "pad_waste", "multicast_saving"):
        assert ((col[w] >= 0) & (col[w] < 1)).all(), w
    assert (col["traffic_over_min"] >= 1 - 1e-6).all()
    assert (col["log2_roofline_over_ideal"] >= -1e-6).all()  # padding and re-reads only add
    assert (col["active_ctas"] <= device.sm_count).all()
    assert (col["pipeline_depth"] <= col["stages"]).all() and (col["stages"] >= 2).all()
    assert col["a_m_major"].all() == (shape.get("a_major") == "m")


def test_monotone_in_k_and_cluster():
    c = KernelConfig(128, 128, False, 1, 1)
    small = one(GemmProblem(2048, 2048, 1024), c, H200)
    big = one(GemmProblem(2048, 2048, 8192), c, H200)
    assert big["k_iters"] > small["k_iters"] and big["roofline_s"] > small["roofline_s"]
    moved = [one(SQUARE, replace(c, cluster_n=cn), H200)["log2_bytes_moved"] for cn in (1, 2, 4)]
    assert moved[0] > moved[1] > moved[2]


def test_dataset_rows_match_per_problem_rows():
    """Mixed problems and dtypes in one call give what each problem gives alone."""
    p1 = GemmProblem(4096, 1024, 512)
    p2 = GemmProblem(96, 4096, 8192, dtype="fp16", out_dtype="fp16", a_major="m")
    c1, c2 = enumerate_configs("sm90", p1)[::7], enumerate_configs("sm90", p2)[::5]
    cols1 = {**config_columns(c1), **problem_columns(p1, len(c1))}
    cols2 = {**config_columns(c2), **problem_columns(p2, len(c2))}
    mixed = {k: np.concatenate([cols1[k], cols2[k]]) for k in cols1}
    np.testing.assert_array_equal(
        feature_matrix(mixed, H200),
        np.concatenate([feature_matrix(cols1, H200), feature_matrix(cols2, H200)]))


def test_optional_string_columns_default_to_bf16_k_major():
    configs = enumerate_configs("sm90")[:50]
    cols = {**config_columns(configs), **problem_columns(SQUARE, 50)}
    bare = {k: v for k, v in cols.items() if k in RAW_NAMES}
    np.testing.assert_array_equal(feature_matrix(bare, H200), feature_matrix(cols, H200))


def test_names_and_columns():
    assert len(set(FEATURE_NAMES)) == len(FEATURE_NAMES) == len(RAW_NAMES) + len(DERIVED_NAMES)
    assert FEATURE_NAMES[:4] == ("m", "n", "k", "batch") and set(CONFIG_FIELDS) <= set(RAW_NAMES)
    cols = config_columns([KernelConfig(swap_ab=True)])
    assert cols["swap_ab"].tolist() == [1] and cols["tile_n"].tolist() == [192]
    assert problem_feature_matrix(SQUARE, [], H200).shape == (0, len(FEATURE_NAMES))


# ---------------------------------------------------------------- errors
def _cols(n=3, **over):
    cols = {**config_columns(enumerate_configs("sm90")[:n]), **problem_columns(SQUARE, n)}
    return {**cols, **over}


@pytest.mark.parametrize("cols,match", [
    ({k: v for k, v in _cols().items() if k != "tile_m"}, "missing: tile_m"),
    (_cols(m=np.array([1, 2])), "differ in length"),
    (_cols(tile_n=np.array([128.0, np.nan, 64.0])), "'tile_n' has missing.*cublas"),
    (_cols(tile_n=np.array([128, None, 64], dtype=object)), "'tile_n' has missing"),
    (_cols(k=np.array([0, 64, 64])), "'k' must be positive"),
    (_cols(dtype=np.array(["bf16", "int4", "bf16"])), "unknown dtype 'int4'"),
    (_cols(dtype=np.array(["fp32"] * 3)), "no peak rate for dtype 'fp32'"),
    (_cols(a_major=np.array(["k", "x", "k"])), "'a_major' must be 'm' or 'k'"),
    (_cols(arch=np.array(["sm90", "sm100", "sm90"])), r"arch \['sm100'\].*split the rows"),
    (_cols(cluster_m=np.array([1, 16, 1])), "cluster of 16 CTAs exceeds H200's maximum of 8"),
])
def test_bad_columns_raise_value_error(cols, match):
    with pytest.raises(ValueError, match=match):
        feature_matrix(cols, H200)
