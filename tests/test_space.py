"""The search space: problem validation, config round-trips, the rules and the enumeration."""

from __future__ import annotations

import dataclasses

import pytest

from cutetune.space import (CONFIG_RULES, PROBLEM_RULES, GemmProblem, KernelConfig, ProblemError,
    compile_keys, enumerate_configs, is_valid, quack_default_config, violations)
from cutetune.space.enumerate import AXES, grid, sample_configs
from cutetune.space.problem import ARCHES

ALL_RULES = CONFIG_RULES + PROBLEM_RULES


# ---------------------------------------------------------------- problems
@pytest.mark.parametrize("kwargs, words", [
    (dict(m=0, n=64, k=64), ["m", "positive", "0"]),
    (dict(m=64, n=-8, k=64), ["n", "positive", "-8"]),
    (dict(m=64, n=64, k=64, batch=0), ["batch", "positive"]),
    (dict(m=64, n=64, k=64.0), ["k", "positive integer"]),
    (dict(m=64, n=64, k=64, arch="sm80"), ["arch", "sm80", "sm90", "sm100"]),
    (dict(m=64, n=64, k=64, dtype="int8"), ["dtype", "int8", "bf16"]),
    (dict(m=64, n=64, k=64, dtype="fp8_e4m3"), ["fp8_e4m3", "not supported"]),
    (dict(m=64, n=64, k=64, out_dtype="fp64"), ["out_dtype", "fp64"]),
    (dict(m=64, n=64, k=64, a_major="n"), ["a_major", "'n'"]),
    (dict(m=64, n=64, k=64, b_major="m"), ["b_major", "'m'"]),
    (dict(m=64, n=64, k=100), ["K=100", "A", "multiple of 8", "bf16"]),
    (dict(m=64, n=100, k=64), ["N=100", "multiple of 8"]),
    (dict(m=100, n=64, k=64, a_major="m"), ["M=100", "A", "multiple of 8"]),
    (dict(m=64, n=100, k=64, b_major="k"), ["N=100", "D"]),
])
def test_problem_errors_name_the_problem(kwargs, words):
    with pytest.raises(ProblemError) as e:
        GemmProblem(**kwargs)
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


def test_problem_alignment_follows_majors():
    GemmProblem(100, 64, 64)  # M is not contiguous anywhere when A is K-major
    GemmProblem(64, 64, 64, a_major="m", b_major="n")
    assert issubclass(ProblemError, ValueError)
    # one token's weight gradient: quack refused every config of these (H200, s27 layouts data)
    for majors in ({"a_major": "m"}, {"b_major": "n"}, {"a_major": "m", "b_major": "n"}):
        with pytest.raises(ProblemError, match="K=1 with an m-major A or an n-major B"):
            GemmProblem(3584, 14336, 1, **majors)


def test_problem_flops_bytes_key():
    p = GemmProblem(128, 256, 512, batch=2)
    assert p.flops == 2 * 128 * 256 * 512 * 2
    assert p.min_bytes == 2 * ((128 * 512 + 512 * 256) * 2 + 128 * 256 * 2)
    assert p.key() == "sm90:bf16->bf16:kk:b2:m128:n256:k512"
    assert GemmProblem(**p.to_dict()) == p
    q = GemmProblem(64, 128, 256, dtype="fp16", out_dtype="fp16", a_major="m", b_major="n",
                    arch="sm100")
    assert GemmProblem.from_key(p.key()) == p and GemmProblem.from_key(q.key()) == q
    for bad in ("sm90:bf16:kk:b1:m1:n8:k8", "sm90:bf16->bf16:kk:m1:n8:k8:b1", "m4096"):
        with pytest.raises(ProblemError, match="is not a problem key"):
            GemmProblem.from_key(bad)
    with pytest.raises(ProblemError, match="unknown arch"):
        GemmProblem.from_key("sm80:bf16->bf16:kk:b1:m1:n8:k8")


# ---------------------------------------------------------------- configs
def test_from_dict_missing_fields_take_quacks_sm90_default():
    from quack.gemm_config import _default_config_for_cap

    q = _default_config_for_cap(9)
    ours = KernelConfig.from_dict({})
    assert ours == quack_default_config("sm90")
    for f in dataclasses.fields(KernelConfig):
        assert getattr(ours, f.name) == getattr(q, f.name), f.name
    assert KernelConfig.from_dict({"tile_n": 128}) == dataclasses.replace(ours, tile_n=128)


def test_from_dict_unknown_field_is_an_error():
    with pytest.raises(ValueError, match="tile_mm"):
        KernelConfig.from_dict({"tile_mm": 128})


def test_from_dict_round_trips_and_accepts_quack_extras():
    c = KernelConfig(64, 96, False, 1, 2, True, 1, 2, False)
    assert KernelConfig.from_dict(c.to_dict()) == c
    quack_dict = dataclasses.asdict(c.to_quack("sm90"))  # has tile_k, num_warps, ...
    assert KernelConfig.from_dict(quack_dict) == c


@pytest.mark.parametrize("d, match", [
    ({"pingpong": "false"}, "pingpong must be true or false, got 'false'"),
    ({"swap_ab": 2}, "swap_ab must be true or false, got 2"),
    ({"tile_m": 128.9}, "tile_m must be an integer, got 128.9"),
    ({"tile_m": 128.0}, "tile_m must be an integer, got 128.0"),
    ({"split_k": "2"}, "split_k must be an integer, got '2'"),
    ({"cluster_m": True}, "cluster_m must be an integer, got True"),
    ({"cluster_k": 2}, "cluster_k=2: cutetune does not tune cluster_k"),
    ({"num_warps": 8}, "num_warps=8"),
    ({"tile_k": 64}, "tile_k=64"),
    ({"use_tma_gather": True}, "use_tma_gather=True"),
    ({"device_capacity": 8}, r"device_capacity=8 is not one of \[9, 10\]"),
    ([128, 192], "a config is an object of fields, got list"),
])
def test_from_dict_is_strict(d, match):
    """A config read loosely is another kernel, ranked or run without a word."""
    with pytest.raises(ValueError, match=match):
        KernelConfig.from_dict(d)


def test_from_dict_takes_json_flags_as_0_or_1_and_checks_the_arch():
    assert KernelConfig.from_dict({"pingpong": 0, "swap_ab": 1}) == KernelConfig(
        pingpong=False, swap_ab=True)
    assert KernelConfig.from_dict({"device_capacity": 10}, "sm100") == KernelConfig()
    with pytest.raises(ValueError, match=r"device_capacity=9 is not sm100's \(10\)"):
        KernelConfig.from_dict({"device_capacity": 9}, "sm100")


@pytest.mark.parametrize("kw", [{"m": 10**12}, {"m": 10**30}, {"batch": 2**20, "m": 4096},
                                {"arch": "sm100", "m": 2**24, "n": 2**12}])
def test_problems_no_device_can_hold_are_refused(kw):
    """Operands larger than any device of the arch holds are a typo: refused, not ranked."""
    with pytest.raises(ProblemError, match=r"more than any sm\d+ device holds"):
        GemmProblem(**{"m": 4096, "n": 4096, "k": 4096, **kw})


def test_the_largest_problems_a_device_holds_are_kept():
    """The bound is the arch's largest listed device: 161 GiB of operands fit a B200 (180 GiB)
    but no sm90 device (the H200 has 141 GiB)."""
    GemmProblem(2**21, 16384, 16384)  # 128.5 GiB
    GemmProblem(2**21, 20480, 20480, arch="sm100")
    with pytest.raises(ProblemError, match=r"161 GiB, more than any sm90 device holds "
                                           r"\(H200: 141 GiB\)"):
        GemmProblem(2**21, 20480, 20480)


# ---------------------------------------------------------------- rules
def test_rules_have_docstrings_and_unique_names():
    names = [r.name for r in ALL_RULES]
    assert len(names) == len(set(names))
    for r in ALL_RULES:
        assert len(r.why) > 40, r.name
        assert set(r.arches) <= set(ARCHES)


@pytest.mark.parametrize("arch", ARCHES)
def test_every_enumerated_config_passes_every_rule(arch):
    for c in enumerate_configs(arch):
        assert not [r.check for r in CONFIG_RULES if arch in r.arches and not r.check(c, arch)]


@pytest.mark.parametrize("arch", ARCHES)
def test_no_dead_config_rule(arch):
    """Each config rule of the arch rejects at least one grid point that breaks it alone."""
    alone = {r.name: 0 for r in CONFIG_RULES if arch in r.arches}
    for c in grid(arch):
        broken = violations(c, arch)
        if len(broken) == 1:
            alone[broken[0].name] += 1
    assert all(alone.values()), alone


def test_problem_rule_rejects_split_k_on_short_k():
    c = KernelConfig(128, 128, True, 1, 1, False, 8, 4, False)
    assert is_valid(c, "sm90")
    short = GemmProblem(128, 128, 256)  # 4 K tiles of 64 cannot feed 4 splits of 2 tiles
    assert [r.name for r in violations(c, "sm90", short)] == ["split_k_has_k_tiles"]
    assert is_valid(c, "sm90", GemmProblem(128, 128, 512))
    assert c not in enumerate_configs("sm90", short)


@pytest.mark.parametrize("arch, configs, kernels", [("sm90", 2400, 1200), ("sm100", 1944, 972)])
def test_space_sizes(arch, configs, kernels):
    """Pinned so a rule change that moves the space is a deliberate, reviewed change."""
    valid = enumerate_configs(arch)
    assert len(valid) == configs >= 1000
    assert len(compile_keys(valid)) == kernels
    assert len(valid) < sum(1 for _ in grid(arch))


def test_axes_cover_the_valid_space():
    for arch in ARCHES:
        for c in enumerate_configs(arch):
            assert c.tile_m in AXES[arch]["tile_m"] and c.tile_n in AXES[arch]["tile_n"]


def test_quack_sm90_configs_are_accepted():
    """quack's own 44 sm90 autotune configs all pass our rules (none is excluded by design)."""
    from quack.gemm_config import _get_sm90_configs

    ours = [KernelConfig.from_dict(dataclasses.asdict(g)) for g in _get_sm90_configs()]
    assert len(ours) == 44
    rejected = {c.short(): [r.name for r in violations(c, "sm90")] for c in ours
                if not is_valid(c, "sm90")}
    assert rejected == {}


def test_quack_default_configs_are_valid():
    for arch in ARCHES:
        assert is_valid(quack_default_config(arch), arch)


def test_sample_configs_is_seeded_and_distinct():
    a = sample_configs("sm90", 50, seed=3)
    assert a == sample_configs("sm90", 50, seed=3) != sample_configs("sm90", 50, seed=4)
    assert len(set(a)) == 50 and all(is_valid(c, "sm90") for c in a)


def test_unknown_arch_is_a_problem_error():
    with pytest.raises(ProblemError, match="sm80"):
        enumerate_configs("sm80")


# ---------------------------------------------------------------- kernel layout / signature
def test_kernel_layout_routes_swap_ab():
    from cutetune.tuner.kernels.compile import kernel_layout

    p = GemmProblem(256, 512, 1024, a_major="m", b_major="k")
    plain = kernel_layout(p, KernelConfig(swap_ab=False))
    assert (plain.a_major, plain.b_major, plain.d_major, plain.b_kn) == ("m", "k", "n", True)
    swapped = kernel_layout(p, KernelConfig(swap_ab=True))
    # kernel A = B^T (N, K) is K-major; kernel B = A (M, K) is M-major, i.e. "n" in its frame
    assert (swapped.a_major, swapped.b_major, swapped.d_major, swapped.b_kn) == ("k", "n", "m",
                                                                                  False)
    assert not plain.batched
    assert kernel_layout(p, KernelConfig(split_k=2)).batched
    assert kernel_layout(GemmProblem(256, 512, 1024, batch=3), KernelConfig()).batched


def test_kernel_signature_matches_quacks_compile_gemm():
    import inspect

    from quack.gemm import _compile_gemm

    from cutetune.tuner.kernels.compile import kernel_signature

    params = inspect.signature(inspect.unwrap(_compile_gemm)).parameters
    p = GemmProblem(256, 512, 1024, arch="sm100")
    c = KernelConfig(256, 128, False, 2, 1, False, 8, 1, True)
    sig = kernel_signature(p, c)
    assert len(sig) == len(params)
    named = dict(zip(params, sig))
    assert named["tile_shape_mn"] == (256, 128)
    assert named["cluster_shape_mnk"] == (2, 1, 1)
    assert named["is_dynamic_persistent"] is True
    assert named["device_capacity"] == (10, 0)
    # max_swizzle_size is a run-time argument: it must not split the compile key
    assert kernel_signature(p, c) == kernel_signature(p, dataclasses.replace(c, max_swizzle_size=1))
    assert kernel_signature(p, c) != kernel_signature(p, dataclasses.replace(c, swap_ab=True))


def test_an_n_major_kernel_b_refuses_the_wide_cooperative_192_tile():
    """On sm90 a cooperative 192 x 160 tile aborts cute.compile (SIGABRT) with an N-major
    kernel B, dense too (a plain x @ W, W stored (K, N); an M-major A swapped): the rule keeps
    it out there, and K-major kernel Bs keep it."""
    from cutetune.space.rules import is_valid

    wide = KernelConfig(192, 160, False, 1, 1, False, 8, 1, False)
    assert is_valid(wide, "sm90", GemmProblem(4096, 4096, 4096))
    assert not is_valid(wide, "sm90", GemmProblem(4096, 4096, 4096, b_major="n"))
    swapped = KernelConfig(192, 160, False, 1, 1, True, 8, 1, False)
    assert not is_valid(swapped, "sm90", GemmProblem(4096, 4096, 4096, a_major="m"))
    assert is_valid(swapped, "sm90", GemmProblem(4096, 4096, 4096))


def test_layouts_give_each_layers_gemm_of_that_layout():
    """A forward problem (kk) of a linear layer gives its input gradient (kn: M, K, N) and its
    weight gradient (mn: N, K, M, the tokens the reduction), and mk its sizes with an M-major
    A, which needs M aligned for TMA (M=1 has neither mk nor mn: its weight gradient has K=1);
    grouped problems keep their GEMM's."""
    from cutetune.space.problem import GroupedProblem
    from cutetune.space.suites import LAYOUTS, in_layouts

    fwd = [("a", GemmProblem(1, 14336, 4096)), ("b", GemmProblem(64, 1024, 4096))]
    grouped = ("g", GroupedProblem(8, 1024, 4096, 7168))
    got = in_layouts([*fwd, grouped], list(LAYOUTS))
    assert [(s, p.m, p.n, p.k, p.a_major + p.b_major) for s, p in got if s != "g"] == [
        ("a", 1, 14336, 4096, "kk"), ("a", 1, 4096, 14336, "kn"),
        ("b", 64, 1024, 4096, "kk"), ("b", 64, 4096, 1024, "kn"), ("b", 64, 1024, 4096, "mk"),
        ("b", 1024, 4096, 64, "mn")]
    assert got[-1] == grouped and len({p.key() for _, p in got}) == len(got)
    assert all(p.flops == fwd[s == "b"][1].flops for s, p in got if s != "g")
    with pytest.raises(ValueError, match="unknown layout nk; known: kk, kn, mk, mn"):
        in_layouts(fwd, ["nk"])


def test_the_bmm_suite_is_attentions_batched_gemms():
    from cutetune.space.enumerate import enumerate_configs
    from cutetune.space.suites import BMM_BATCHES, suite

    problems = suite("bmm")
    assert len(problems) >= 150 and {p.batch for _, p in problems} == set(BMM_BATCHES)
    assert {(s, p.a_major + p.b_major) for s, p in problems} == {
        ("attention_scores", "kk"), ("attention_values", "kn")}
    assert all(enumerate_configs(p.arch, p) for _, p in problems)
