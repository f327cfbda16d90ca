"""The compile check: the runner's pure parts, and real GPU-blind CuteDSL compiles (marked)."""

from __future__ import annotations

import json

import pytest

from cutetune.space import KernelConfig, compile_keys, enumerate_configs, is_valid
from cutetune.space.rules import CONFIG_RULES
from cutetune.tuner.measure.space_check import (CompileResult, compile_configs, compile_pool,
    pick_rejected, pick_valid, rule_verdicts, run_check, summarize)


# ---------------------------------------------------------------- pure parts
def test_pick_valid_is_distinct_kernels_and_seeded():
    keys = compile_keys(enumerate_configs("sm90"))
    assert pick_valid("sm90", None) == keys
    assert pick_valid("sm90", 10**6) == keys
    a = pick_valid("sm90", 12, seed=1)
    assert a == pick_valid("sm90", 12, seed=1) != pick_valid("sm90", 12, seed=2)
    assert len(set(a)) == 12 and set(a) <= set(keys)
    assert all(c.max_swizzle_size == 0 for c in a)  # compile keys, not run-time variants


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_pick_rejected_covers_every_rule_alone_first(arch):
    rules = [r.name for r in CONFIG_RULES if arch in r.arches]
    picks = pick_rejected(arch, len(rules), seed=0)
    assert len(picks) == len(set(c for c, _ in picks)) == len(rules)
    assert sorted(broken[0] for _, broken in picks) == sorted(rules)
    for c, broken in picks:
        assert not is_valid(c, arch) and len(broken) == 1


def test_summarize_quantiles_and_failures():
    c = KernelConfig()
    results = [CompileResult(c, "ok", float(s)) for s in range(1, 11)]
    results.append(CompileResult(c, "error", 0.1, "ValueError: bad tile"))
    s = summarize(results, wall_s=30.0)
    assert (s["count"], s["ok"], s["failed"]) == (11, 10, 1)
    assert (s["compile_s_p50"], s["compile_s_p90"], s["compile_s_max"]) == (5.0, 9.0, 10.0)
    assert s["configs_per_minute"] == 22.0


def test_rule_verdicts_attribute_only_single_rule_points():
    c = KernelConfig()
    results = [CompileResult(c, "error", 0.1, "x", broken_rules=("sm90_tile_n",)),
               CompileResult(c, "ok", 1.0, broken_rules=("split_k_design",)),
               CompileResult(c, "ok", 1.0, broken_rules=("split_k_design", "cluster_shape"))]
    v = rule_verdicts("sm90", results)
    assert v["sm90_tile_n"]["verdict"] == "compiler agrees"
    assert v["split_k_design"]["verdict"].startswith("compiler accepts")
    assert v["split_k_design"]["tried_with_other_rules"] == 1
    assert v["cluster_shape"]["verdict"].startswith("untested")
    assert "sm100_tile_m" not in v


# ---------------------------------------------------------------- real compiles
@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_fixed_sample_compiles(arch):
    report = run_check(arch, sample=6, seed=0, workers=2)
    s = report["summary"]
    assert report["failures"] == [] and (s["ok"], s["failed"]) == (6, 0), report["failures"]
    assert report["dsl_arch"] == {"sm90": "sm_90a", "sm100": "sm_100a"}[arch]
    assert all(r["seconds"] > 0 for r in report["results"])
    assert 0 < s["compile_s_p50"] <= s["compile_s_p90"] <= s["compile_s_max"]
    json.dumps(report)


@pytest.mark.compile
def test_invalid_config_fails_without_killing_the_run(tmp_path):
    good = [KernelConfig(128, 128, True, 1, 1), KernelConfig(64, 64, False, 2, 1, True)]
    bad = KernelConfig(128, 8, True, 1, 1)  # tile N 8: GemmSm90 requires a multiple of 16
    assert not is_valid(bad, "sm90")
    with compile_pool("sm90", str(tmp_path), workers=1) as pool:  # one worker sees it all
        results = compile_configs(pool, "sm90", [good[0], bad, good[1]])
        again = compile_configs(pool, "sm90", [KernelConfig(64, 128, True, 1, 2)])
    assert again[0].ok
    assert [r.status for r in results] == ["ok", "error", "ok"]
    assert "tile shape N" in results[1].error
    assert [r.config for r in results] == [good[0], bad, good[1]]
