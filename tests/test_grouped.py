"""Grouped (MoE expert) GEMMs in the space: the problem, its config families and rules, the
kernel routing quack gives them, the suites and routings, and the features."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cutetune.space import GemmProblem, KernelConfig, ProblemError, quack_default_config
from cutetune.space.device import B200, H200
from cutetune.space.enumerate import compile_keys, enumerate_configs, grid, sample_configs
from cutetune.space.features import (BALANCED_NAMES, DERIVED_NAMES, GROUPED_FEATURE_NAMES,
    GROUPED_RAW_NAMES, config_columns, derived_features, grouped_derived_features,
    grouped_feature_matrix, grouped_ideal_time_s, grouped_problem_columns,
    grouped_problem_feature_matrix, problem_columns)
from cutetune.space.problem import ARCHES, GROUPED_GEMMS, GroupedProblem
from cutetune.space.rules import (FAMILIES, FAMILY_RULES, GROUPED, family_of, family_rules,
    is_valid, violations)
from cutetune.space.suites import (MOE_MODELS, MOE_TOKENS, ROUTINGS, expert_gemm, grouped_suite,
    moe_problems, random_grouped_problems, routing_counts)

DSV3_UP = GroupedProblem(256, 16 * 8, 4096, 7168)  # DeepSeek-V3 gate+up, 16 tokens, top-8


# ---------------------------------------------------------------- problems
@pytest.mark.parametrize("kwargs, words", [
    (dict(experts=0, m=64, n=64, k=64), ["experts", "positive", "0"]),
    (dict(experts=8, m=-1, n=64, k=64), ["m", "positive"]),
    (dict(experts=8, m=64, n=64, k=64, gemm="bwd"), ["grouped GEMM 'bwd'", "fwd, dgrad, wgrad"]),
    (dict(experts=8, m=64, n=64, k=64, arch="sm80"), ["arch", "sm80"]),
    (dict(experts=8, m=64, n=64, k=64, dtype="fp8_e4m3"), ["fp8_e4m3", "not supported"]),
    (dict(experts=8, m=64, n=64, k=100), ["K=100", "A", "multiple of 8"]),
    (dict(experts=8, m=64, n=100, k=64, gemm="dgrad"), ["N=100", "B", "multiple of 8"]),
    (dict(experts=8, m=100, n=64, k=64, gemm="wgrad"), ["M=100", "A", "multiple of 8"]),
])
def test_grouped_problem_errors_name_the_problem(kwargs, words):
    with pytest.raises(ProblemError) as e:
        GroupedProblem(**kwargs)
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


def test_grouped_problem_layouts_follow_quacks_varlen_asserts():
    """fwd and dgrad are varlen M (A K-major, D N-major: _build_gemm_plan's asserts), B K- or
    N-major (W read transposed, or as it is); wgrad is varlen K (A M-major, B N-major)."""
    got = {g: (p.ragged, p.family, p.a_major, p.b_major) for g in GROUPED_GEMMS
           for p in [GroupedProblem(8, 64, 64, 64, gemm=g)]}
    assert got == {"fwd": ("m", "varlen_m", "k", "k"), "dgrad": ("m", "varlen_m", "k", "n"),
                   "wgrad": ("k", "varlen_k", "m", "n")}
    GroupedProblem(8, 100, 64, 64)  # the ragged M is nobody's contiguous dimension
    GroupedProblem(8, 64, 64, 100, gemm="wgrad")  # nor is the ragged K


def test_grouped_problem_flops_bytes_key():
    p = GroupedProblem(8, 1024, 512, 256, gemm="dgrad", dtype="fp16", out_dtype="fp16",
                       arch="sm100")
    assert p.flops == 2 * 1024 * 512 * 256
    assert p.min_bytes == (1024 * 256 + 8 * 256 * 512) * 2 + 1024 * 512 * 2
    assert p.key() == "sm100:fp16->fp16:dgrad:e8:m1024:n512:k256"
    assert GroupedProblem.from_key(p.key()) == p == GroupedProblem(**p.to_dict())
    # Decode: 128 rows reach at most 128 of 256 experts, whose weights alone are read.
    assert DSV3_UP.active_experts == 128
    assert DSV3_UP.min_bytes == (128 * 7168 + 128 * 7168 * 4096 + 128 * 4096) * 2
    w = GroupedProblem(256, 4096, 7168, 128, gemm="wgrad")  # every expert writes its gradient
    assert w.active_experts == 256
    assert w.min_bytes == (4096 * 128 + 128 * 7168) * 2 + 256 * 4096 * 7168 * 2


def test_grouped_and_dense_keys_do_not_parse_as_each_other():
    dense = GemmProblem(128, 256, 512, batch=8)
    with pytest.raises(ProblemError, match="is not a problem key.*fwd:e256"):
        GroupedProblem.from_key(dense.key())
    with pytest.raises(ProblemError, match="is not a problem key.*kk:b1"):
        GemmProblem.from_key(DSV3_UP.key())
    with pytest.raises(ProblemError, match="unknown grouped GEMM 'xx'"):
        GroupedProblem.from_key("sm90:bf16->bf16:xx:e8:m64:n64:k64")
    assert dense.key() == "sm90:bf16->bf16:kk:b8:m128:n256:k512"  # unchanged by the family


# ---------------------------------------------------------------- families and rules
def test_every_rule_has_a_reason_and_known_families():
    for family, rules in FAMILY_RULES.items():
        assert len({r.name for r in rules}) == len(rules)
        for r in rules:
            assert family in r.families and set(r.families) <= set(FAMILIES)
            assert len(r.why) > 40 and set(r.arches) <= set(ARCHES), r.name


def test_family_of():
    assert family_of(None) == "dense" and family_of(GemmProblem(8, 8, 8)) == "dense"
    assert family_of(DSV3_UP) == "varlen_m" and family_of(None, "varlen_k") == "varlen_k"
    with pytest.raises(ProblemError, match="unknown config family 'varlen_n'"):
        family_of(None, "varlen_n")
    with pytest.raises(ProblemError, match="a varlen_m problem has no dense configs"):
        violations(KernelConfig(), "sm90", DSV3_UP, family="dense")


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("family", GROUPED)
def test_no_dead_grouped_rule(arch, family):
    """Each config rule of the family rejects a grid point that breaks it alone."""
    alone = {r.name: 0 for r in family_rules(family, arch, problem=False)}
    for c in grid(arch, family):
        broken = violations(c, arch, family=family)
        if len(broken) == 1:
            alone[broken[0].name] += 1
    assert all(alone.values()), alone


@pytest.mark.parametrize("arch, varlen_m, varlen_k", [("sm90", (672, 336), (1344, 672)),
                                                      ("sm100", (240, 120), (480, 240))])
def test_grouped_space_sizes(arch, varlen_m, varlen_k):
    """Pinned like the dense sizes: the grouped space moves only by a reviewed change."""
    for family, (configs, kernels) in (("varlen_m", varlen_m), ("varlen_k", varlen_k)):
        valid = enumerate_configs(arch, family=family)
        assert (len(valid), len(compile_keys(valid))) == (configs, kernels)


@pytest.mark.parametrize("arch", ARCHES)
def test_grouped_configs_obey_quacks_varlen_checks(arch):
    m = enumerate_configs(arch, family="varlen_m")
    k = enumerate_configs(arch, family="varlen_k")
    assert all(c.split_k == 1 for c in m + k)
    assert not any(c.swap_ab for c in m) and any(c.swap_ab for c in k)
    assert set(m) == {c for c in k if not c.swap_ab}
    assert any(c.is_dynamic_persistent for c in m)  # sm90 too: quack allocates the semaphore
    fwd = GroupedProblem(8, 4096, 4096, 64, arch=arch)
    assert enumerate_configs(arch, fwd) == m  # only sm90's N-major B narrows a GEMM's space
    assert len(set(sample_configs(arch, 20, problem=fwd))) == 20
    assert set(sample_configs(arch, 20, problem=fwd)) <= set(m)


def test_sm90_wide_192_tile_needs_a_k_major_b():
    """The cooperative 192 x >128 tile aborts cute.compile with an N-major B (dgrad, and wgrad
    swapped or not), so those GEMMs' spaces leave it out on sm90 and fwd's keeps it."""
    from cutetune.space.rules import kernel_b_major

    wide = [c for c in enumerate_configs("sm90", family="varlen_k")
            if c.tile_m == 192 and not c.pingpong and c.tile_n > 128]
    assert {c.swap_ab for c in wide} == {False, True} and {c.tile_n for c in wide} == {
        160, 192, 256}
    sizes = {}
    for gemm in GROUPED_GEMMS:
        p = GroupedProblem(8, 4096, 4096, 4096, gemm=gemm)
        own = [c for c in wide if gemm == "wgrad" or not c.swap_ab]  # varlen M cannot swap
        assert {kernel_b_major(c, p) for c in own} == {"k" if gemm == "fwd" else "n"}
        valid = enumerate_configs("sm90", p)
        assert (set(own) <= set(valid)) if gemm == "fwd" else not set(own) & set(valid)
        sizes[gemm] = (len(valid), len(compile_keys(valid)))
        assert [r.name for r in violations(own[0], "sm90", p)] == (
            [] if gemm == "fwd" else ["sm90_tile_192_wide_needs_k_major_b"])
    assert sizes == {"fwd": (672, 336), "dgrad": (624, 312), "wgrad": (1248, 624)}
    sm100 = GroupedProblem(8, 4096, 4096, 4096, gemm="wgrad", arch="sm100")
    assert enumerate_configs("sm100", sm100) == enumerate_configs("sm100", family="varlen_k")
    assert kernel_b_major(KernelConfig(swap_ab=True), GemmProblem(64, 64, 64, a_major="m")) == "n"


def test_quacks_own_configs_and_varlen_prune_agree_with_the_rules():
    """quack's autotune lists, pruned as prune_invalid_gemm_configs prunes a varlen-M call
    (config_supports), pass our varlen-M rules, and what it prunes fails them; varlen K keeps
    all. Only its 256x512 sm100 tile is out (sm100_tile_n says why)."""
    from quack.gemm_config import _get_sm90_configs, _get_sm100_configs, config_supports

    for arch, quack in (("sm90", _get_sm90_configs()), ("sm100", _get_sm100_configs())):
        for q in quack:
            if q.use_tma_gather:  # only with gather_A: prune_invalid_gemm_configs drops it
                continue
            c = KernelConfig.from_dict(dataclasses.asdict(q))
            if c.tile_n == 512:
                continue
            assert is_valid(c, arch, family="varlen_k"), c.short()
            assert is_valid(c, arch, family="varlen_m") == config_supports(q, varlen_m=True)
    for arch in ARCHES:
        default = quack_default_config(arch)
        assert all(is_valid(default, arch, family=f) for f in GROUPED)


# ---------------------------------------------------------------- kernel routing
def test_grouped_kernel_layout_mirrors_quacks_routing():
    from cutetune.tuner.kernels.compile import kernel_layout

    c = KernelConfig(128, 128, False, 1, 1)
    lay = {g: kernel_layout(GroupedProblem(8, 64, 64, 64, gemm=g), c) for g in GROUPED_GEMMS}
    assert {g: (x.a_major, x.b_major, x.d_major, x.batched, x.b_kn, x.varlen)
            for g, x in lay.items()} == {"fwd": ("k", "k", "n", True, False, "m"),
                                         "dgrad": ("k", "n", "n", True, False, "m"),
                                         "wgrad": ("m", "n", "n", True, False, "k")}
    swapped = kernel_layout(GroupedProblem(8, 64, 64, 64, gemm="wgrad"),
                            dataclasses.replace(c, swap_ab=True))
    # kernel A = X^T (N, K) is M-major in its frame, kernel B = dY^T N-major, D^T m-major
    assert (swapped.a_major, swapped.b_major, swapped.d_major, swapped.varlen) == (
        "m", "n", "m", "k")
    with pytest.raises(ProblemError, match="swap_ab on a varlen-M GEMM.*gemm_tuned"):
        kernel_layout(DSV3_UP, dataclasses.replace(c, swap_ab=True))
    with pytest.raises(ProblemError, match="split-K on a grouped GEMM.*_build_gemm_plan"):
        kernel_layout(dataclasses.replace(DSV3_UP, gemm="wgrad"), dataclasses.replace(
            c, split_k=2))


def test_grouped_kernel_signature_and_class():
    import inspect

    from quack.gemm import _compile_gemm

    from cutetune.tuner.kernels.compile import kernel_signature, signature_class

    names = list(inspect.signature(inspect.unwrap(_compile_gemm)).parameters)
    c = KernelConfig(128, 192, True, 2, 1, False, 8, 1, True)
    for gemm, varlen in (("fwd", (True, False)), ("wgrad", (False, True))):
        named = dict(zip(names, kernel_signature(GroupedProblem(8, 64, 64, 64, gemm=gemm), c)))
        assert (named["varlen_m"], named["varlen_k"]) == varlen
        assert (named["batched"], named["b_kn"], named["split_k"]) == (True, False, 1)
        assert named["is_dynamic_persistent"] is True
    classes = {signature_class(GroupedProblem(8, 64, 64, 64, gemm=g), c) for g in GROUPED_GEMMS}
    classes.add(signature_class(GemmProblem(64, 64, 64, batch=8), c))
    assert len(classes) == 4
    # the problem's sizes are run-time arguments: one kernel serves them all
    assert kernel_signature(DSV3_UP, c) == kernel_signature(GroupedProblem(8, 64, 64, 64), c)


# ---------------------------------------------------------------- suites
def test_moe_problems_are_each_models_expert_gemms():
    problems = moe_problems()
    assert {m for m, _ in problems} == set(MOE_MODELS)
    keys = [p.key() for _, p in problems]
    assert len(keys) == len(set(keys)) > 400
    assert all(p.flops <= 2**41 for _, p in problems)
    dsv3 = {p for m, p in problems if m == "deepseek_v3"}
    rows = 16 * 8
    assert {DSV3_UP, GroupedProblem(256, rows, 7168, 4096, gemm="dgrad"),
            GroupedProblem(256, 4096, 7168, rows, gemm="wgrad"),
            GroupedProblem(256, rows, 7168, 2048), GroupedProblem(256, rows, 2048, 7168, "dgrad"),
            GroupedProblem(256, 7168, 2048, rows, gemm="wgrad")} <= dsv3
    granite = [p for m, p in problems if m == "granite3.1_1b_a400m"]
    assert len(granite) == 2 * 3 * len(MOE_TOKENS)  # small enough that none is capped
    assert {p.m for p in granite if p.gemm == "fwd"} == {t * 8 for t in MOE_TOKENS}
    assert MOE_TOKENS[0] == 16 and MOE_TOKENS[-1] == 65536


def test_expert_gemm_shapes():
    assert expert_gemm("fwd", 8, 100, 28672, 4096) == GroupedProblem(8, 100, 28672, 4096)
    assert expert_gemm("dgrad", 8, 100, 28672, 4096) == GroupedProblem(8, 100, 4096, 28672,
                                                                       "dgrad")
    assert expert_gemm("wgrad", 8, 100, 28672, 4096) == GroupedProblem(8, 28672, 4096, 100,
                                                                       "wgrad")
    with pytest.raises(ProblemError, match="unknown grouped GEMM"):
        expert_gemm("bwd", 8, 100, 64, 64)


def test_random_grouped_problems_seeded_in_range():
    a = random_grouped_problems(60, seed=3)
    assert a == random_grouped_problems(60, seed=3) != random_grouped_problems(60, seed=4)
    for name, p in a:
        assert name == "moe_random" and 4 <= p.experts <= 256 and p.flops <= 2**41
        n_out, k_in = {"fwd": (p.n, p.k), "dgrad": (p.k, p.n), "wgrad": (p.m, p.n)}[p.gemm]
        assert 512 <= n_out <= 16384 and 512 <= k_in <= 16384 and n_out % 8 == k_in % 8 == 0
    assert {p.gemm for _, p in a} == set(GROUPED_GEMMS)


def test_moe_large_is_what_moe_leaves_out_cheapest_first():
    large = grouped_suite("moe_large")
    small = {p.key() for _, p in moe_problems()}
    assert large and not small & {p.key() for _, p in large}
    assert all(2**41 < p.flops <= 2**45 for _, p in large)
    assert [p.flops for _, p in large] == sorted(p.flops for _, p in large)
    dsv3 = {p for m, p in large if m == "deepseek_v3"}  # the MoE benchmark's biggest GEMMs
    assert {GroupedProblem(256, 8192 * 8, 4096, 7168),
            GroupedProblem(256, 7168, 2048, 32768 * 8, gemm="wgrad")} <= dsv3


def test_grouped_suite_names():
    both = grouped_suite("moe+moe_random", seed=1)
    assert len(both) == len(moe_problems()) + 120
    assert all(isinstance(p, GroupedProblem) for _, p in both)
    with pytest.raises(ValueError,
                       match="unknown problem suite 'llm'.*moe, moe_large, moe_random"):
        grouped_suite("llm")


@pytest.mark.parametrize("kind", ROUTINGS)
@pytest.mark.parametrize("experts, rows", [(1, 5), (8, 0), (8, 1000), (256, 128), (40, 65536)])
def test_routing_counts_sum_and_are_deterministic(kind, experts, rows):
    c = routing_counts(experts, rows, kind, seed=7)
    assert c.dtype == np.int64 and c.shape == (experts,) and c.sum() == rows and c.min() >= 0
    np.testing.assert_array_equal(c, routing_counts(experts, rows, kind, seed=7))


def test_routing_kinds_differ_as_named():
    balanced = routing_counts(64, 64 * 100 + 5, "balanced")
    assert balanced.max() - balanced.min() == 1 and (balanced == 101).sum() == 5
    skewed = routing_counts(64, 6400, "skewed")
    assert skewed.max() > 2 * skewed.mean()
    empty = routing_counts(64, 6400, "empty")
    assert (empty == 0).sum() >= 32 and empty.max() > 0
    assert not np.array_equal(routing_counts(64, 6400, "skewed", seed=1), skewed)
    assert (routing_counts(1, 9, "empty") == [9]).all()  # never every expert empty


@pytest.mark.parametrize("args, match", [((0, 8, "balanced"), "experts must be"),
                                         ((8, -1, "balanced"), "rows must be"),
                                         ((8, 8.0, "balanced"), "rows must be"),
                                         ((8, 8, "zipf"), "unknown routing 'zipf'")])
def test_routing_counts_errors(args, match):
    with pytest.raises(ProblemError, match=match):
        routing_counts(*args)


# ---------------------------------------------------------------- features
def gfeats(problem, configs, device=H200):
    cols = {**config_columns(configs), **grouped_problem_columns(problem, len(configs))}
    return grouped_derived_features(cols, device)


@pytest.mark.parametrize("gemm", ["fwd", "wgrad"])
def test_balanced_features_are_the_batched_gemms(gemm):
    """With the rows splitting evenly, the balanced features are the dense features of the
    batched GEMM of one batch per expert."""
    p = GroupedProblem(16, 16 * 512, 2048, 1024) if gemm == "fwd" else GroupedProblem(
        16, 2048, 1024, 16 * 512, gemm="wgrad")
    batched = GemmProblem(512, 2048, 1024, batch=16) if gemm == "fwd" else GemmProblem(
        2048, 1024, 512, batch=16, a_major="m", b_major="n")
    configs = enumerate_configs("sm90", p)
    got = gfeats(p, configs)
    want = derived_features({**config_columns(configs), **problem_columns(batched, len(configs))},
                            H200)
    for name in DERIVED_NAMES:
        np.testing.assert_array_equal(got[f"balanced_{name}"], want[name], err_msg=name)


def test_decode_bounds_and_active_experts():
    c = KernelConfig(64, 128, True, 1, 1, False, 8, 1, False)
    f = {k: float(v[0]) for k, v in gfeats(DSV3_UP, [c]).items()}
    assert (f["rows_per_expert"], f["active_experts"]) == (0.5, 0.5)
    assert f["balanced_log2_batch"] == 7.0 and f["balanced_log2_m"] == 0.0  # 128 experts x 1 row
    assert f["ragged_block"] == 64 and f["tiles_per_expert"] == 4096 / 128
    # all 128 rows on one expert: 2 M tiles; one row each on 128 experts: 128 M tiles
    assert (f["ragged_tiles_min"], f["ragged_tiles_max"]) == (2, 128)
    assert (f["work_units_min"], f["work_units_max"]) == (2 * 32, 128 * 32)
    assert f["work_units_max"] == f["balanced_work_units"]
    assert f["waves_min"] == pytest.approx(64 / 132)
    assert f["log2_ideal_s"] == pytest.approx(np.log2(grouped_ideal_time_s(DSV3_UP, H200)))


@pytest.mark.parametrize("arch, device", [("sm90", H200), ("sm100", B200)])
@pytest.mark.parametrize("problem", [
    GroupedProblem(8, 4096, 28672, 4096), GroupedProblem(128, 96, 1536, 2048, gemm="dgrad"),
    GroupedProblem(40, 1024, 1536, 8 * 1000, gemm="wgrad"), GroupedProblem(256, 7168, 4096, 24,
                                                                           gemm="wgrad")])
def test_grouped_features_finite_and_bounded(arch, device, problem):
    p = dataclasses.replace(problem, arch=arch)
    configs = enumerate_configs(arch, p)
    x = grouped_problem_feature_matrix(p, configs, device)
    assert x.shape == (len(configs), len(GROUPED_FEATURE_NAMES)) and x.dtype == np.float32
    assert np.isfinite(x).all()
    col = {name: x[:, j] for j, name in enumerate(GROUPED_FEATURE_NAMES)}
    np.testing.assert_array_equal(col["experts"], p.experts)
    assert (col["work_units_min"] <= col["balanced_work_units"]).all()
    assert (col["balanced_work_units"] <= col["work_units_max"]).all()
    assert (col["ragged_tiles_min"] <= col["ragged_tiles_max"]).all()
    assert (col["varlen_k"] == (p.gemm == "wgrad")).all()
    if p.gemm == "wgrad":
        np.testing.assert_array_equal(col["work_units_min"], col["work_units_max"])
    assert col["log2_ideal_s"] == pytest.approx(np.log2(grouped_ideal_time_s(p, device)))


def test_grouped_feature_names_and_mixed_rows():
    assert len(set(GROUPED_FEATURE_NAMES)) == len(GROUPED_FEATURE_NAMES)
    assert GROUPED_FEATURE_NAMES[:4] == ("experts", "m", "n", "k")
    assert set(BALANCED_NAMES) <= set(GROUPED_FEATURE_NAMES)
    p1, p2 = DSV3_UP, GroupedProblem(8, 1024, 512, 2048, gemm="wgrad", dtype="fp16",
                                     out_dtype="fp16")
    c1, c2 = enumerate_configs("sm90", p1)[::9], enumerate_configs("sm90", p2)[::11]
    cols1 = {**config_columns(c1), **grouped_problem_columns(p1, len(c1))}
    cols2 = {**config_columns(c2), **grouped_problem_columns(p2, len(c2))}
    mixed = {k: np.concatenate([cols1[k], cols2[k]]) for k in cols1}
    np.testing.assert_array_equal(
        grouped_feature_matrix(mixed, H200),
        np.concatenate([grouped_feature_matrix(cols1, H200), grouped_feature_matrix(cols2, H200)]))
    assert grouped_problem_feature_matrix(p1, [], H200).shape == (0, len(GROUPED_FEATURE_NAMES))
    assert set(GROUPED_RAW_NAMES) <= set(cols1)


@pytest.mark.parametrize("over, match", [({"gemm": None}, "missing: gemm"),
                                         ({"gemm": np.array(["fwd", "bwd"])}, "'gemm' must be"),
                                         ({"experts": np.array([0, 8])}, "'experts' must be")])
def test_grouped_feature_errors(over, match):
    cols = {**config_columns(enumerate_configs("sm90", DSV3_UP)[:2]),
            **grouped_problem_columns(DSV3_UP, 2)}
    cols.update(over)
    cols = {k: v for k, v in cols.items() if v is not None}
    with pytest.raises(ValueError, match=match):
        grouped_feature_matrix(cols, H200)
