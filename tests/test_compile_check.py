"""The compile check: the runner's pure parts, and real GPU-blind CuteDSL compiles (marked)."""

from __future__ import annotations

import json

import pytest

from cutetune.space import KernelConfig, compile_keys, enumerate_configs, is_valid, violations
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


# ---------------------------------------------------------------- grouped GEMMs
@pytest.mark.parametrize("arch", ["sm90", "sm100"])
@pytest.mark.parametrize("gemm", ["fwd", "dgrad", "wgrad"])
def test_grouped_picks_are_the_gemms(arch, gemm):
    from cutetune.space.rules import family_rules
    from cutetune.tuner.measure.space_check import check_problem

    problem = check_problem(arch, gemm)
    assert pick_valid(arch, None, gemm=gemm) == compile_keys(enumerate_configs(arch, problem))
    picks = pick_rejected(arch, 40, seed=0, gemm=gemm)
    alone = {broken[0] for _, broken in picks if len(broken) == 1}
    assert alone <= {r.name for r in family_rules(problem.family, arch)}
    assert "grouped_no_split_k" in alone and (gemm == "wgrad") != ("varlen_m_no_swap_ab" in alone)
    assert (arch, gemm) not in {("sm90", "dgrad"), ("sm90", "wgrad")} or (
        "sm90_tile_192_wide_needs_k_major_b" in alone)
    for c, broken in picks:
        assert [r.name for r in violations(c, arch, problem)] == list(broken) != []


def test_grouped_check_problem_and_verdicts():
    from cutetune.space.problem import GroupedProblem, ProblemError
    from cutetune.tuner.measure.space_check import check_problem

    assert check_problem("sm100", "dgrad") == GroupedProblem(8, 4096, 4096, 4096, gemm="dgrad",
                                                             arch="sm100")
    with pytest.raises(ProblemError, match="unknown grouped GEMM 'bwd'"):
        check_problem("sm90", "bwd")
    c = KernelConfig()
    v = rule_verdicts("sm90", [CompileResult(c, "error", 0.0, "x",
                                             broken_rules=("varlen_m_no_swap_ab",))], "varlen_m")
    assert v["varlen_m_no_swap_ab"]["verdict"] == "compiler agrees"
    assert "split_k_design" not in v and "sm90_static_scheduler" not in v


QUACK_FINDS_GROUPED = """
import json, sys
from cutetune.tuner.kernels.compile import configure_gpu_blind, kernel_object_path
arch, cache, jobs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
configure_gpu_blind(arch, cache)
import torch
import quack.gemm as qgemm
from quack.gemm_config import SplitKMode
from quack.gemm_interface import _gemm_execute
from quack.rounding import RoundingMode
from cutetune.space.config import KernelConfig
from cutetune.space.problem import GroupedProblem

qgemm.run_gemm_plan = lambda *args, **kwargs: None  # plan (find or compile), launch nothing
qgemm.get_max_active_clusters = lambda *args, **kwargs: 1
bf, experts, (m, n, k), out = torch.bfloat16, 4, (256, 384, 128), []
cu = torch.tensor([0, 64, 64, 200, 256], dtype=torch.int32)  # one expert without rows
for fields, problem in jobs:
    config, p = KernelConfig(**fields), GroupedProblem(**problem)
    if p.gemm == "wgrad":  # dW (E, m, n) = dY^T X, the routed rows (256) the reduction
        a, b = torch.empty(256, m, dtype=bf).mT, torch.empty(256, n, dtype=bf)
        d, varlen = torch.empty(experts, m, n, dtype=bf), {"cu_seqlens_k": cu}
    else:  # X @ W^T with W (E, n, k), or dY @ W with W (E, k, n): as torch._grouped_mm's B
        w = torch.empty(experts, n, k, dtype=bf)
        b = w.mT if p.gemm == "fwd" else torch.empty(experts, k, n, dtype=bf)
        a, d, varlen = torch.empty(m, k, dtype=bf), torch.empty(m, n, dtype=bf), {
            "cu_seqlens_m": cu}
    _gemm_execute(a, b, d, None, bias=None, alpha=1.0, beta=1.0, A_idx=None,
                  batch_idx_permute=None, add_to_output=False,
                  dynamic_scheduler=config.is_dynamic_persistent, config=config.to_quack(arch),
                  rounding_mode=RoundingMode.RN, sr_seed=0, concat_layout=None, SFA=None,
                  SFB=None, split_k=1, split_k_mode=SplitKMode.SERIAL,
                  **{"cu_seqlens_m": None, "cu_seqlens_k": None, **varlen})
    out.append(kernel_object_path(p, config).exists())
print(json.dumps(out))
"""

# Per arch, one kernel of each grouped GEMM: cooperative and pingpong, clusters along M and N,
# swap_ab (varlen K only) and the dynamic scheduler (on sm90 too, as grouped configs allow).
GROUPED_SAMPLE = {
    "sm90": [("fwd", KernelConfig(128, 192, True, 2, 1, False, 8, 1, False)),
             ("dgrad", KernelConfig(64, 128, False, 1, 2, False, 8, 1, True)),
             ("wgrad", KernelConfig(128, 128, True, 1, 1, True, 8, 1, True))],
    "sm100": [("fwd", KernelConfig(256, 128, False, 2, 1, False, 8, 1, True)),
              ("dgrad", KernelConfig(64, 256, False, 1, 2, False, 8, 1, False)),
              ("wgrad", KernelConfig(128, 224, False, 2, 2, True, 8, 1, True))],
}


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_grouped_sample_compiles_where_quacks_own_call_finds_it(arch, tmp_path, run_script):
    """The check compiles a grouped kernel of each GEMM GPU-blind, and quack's own varlen call
    (torch._grouped_mm's operand layouts, an expert without rows) then finds each in the
    cache instead of compiling: the check's kernels are the ones quack runs."""
    import json

    from cutetune.space.problem import GroupedProblem
    from cutetune.tuner.measure.space_check import check_problem

    with compile_pool(arch, str(tmp_path), workers=2) as pool:
        results = [compile_configs(pool, arch, [c], gemm=gemm)[0]
                   for gemm, c in GROUPED_SAMPLE[arch]]
    assert [r.status for r in results] == ["ok"] * 3, [r.error for r in results]
    for (gemm, c), _ in zip(GROUPED_SAMPLE[arch], results):
        assert is_valid(c, arch, check_problem(arch, gemm))
    built = sorted(tmp_path.rglob("*.o"))
    assert len(built) == 3
    jobs = [(c.to_dict(), GroupedProblem(4, 256, 384, 128, gemm=g, arch=arch).to_dict())
            for g, c in GROUPED_SAMPLE[arch]]
    assert run_script(QUACK_FINDS_GROUPED, arch, tmp_path, json.dumps(jobs)) == [True] * 3
    assert sorted(tmp_path.rglob("*.o")) == built  # found, none compiled anew
