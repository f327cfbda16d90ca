"""The grouped (MoE expert GEMM) cost model on a SYNTHETIC dataset: made-up timings, not
measurements.

The synthetic time of a config is its balanced routing's roofline estimate inflated by a
penalty that is a deterministic function of the features (decode-sized experts want 64-row
tiles, larger ones 128; 192-wide tiles, the dynamic persistent scheduler, small clusters and
pingpong are favoured), times 1% lognormal noise. torch._grouped_mm ("aten" rows) runs the
best noiseless config's time times 1.3 up to 8192 routed rows, times 0.9 above: predicted mode
should keep quack for the small problems and fall back for the large ones. Rows carry the real
device name (the features need its spec) and run_id "synthetic-test-stand-in"; nothing here
is ever written to data/. The floors say the code trains, evaluates and predicts end to end;
they say nothing about a GPU.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from cutetune.artifacts import sealed_json
from cutetune.cli import main
from cutetune.models import CostModel, ModelError, load_model
from cutetune.models.data import Measurements, load_measurements
from cutetune.models.dataset import SCHEMA_VERSION, append, load
from cutetune.models.features import dataset_features, problem_descriptors
from cutetune.models.kinds import DENSE, GROUPED, KINDS, kind_of
from cutetune.models.learners import BoosterModel
from cutetune.models.methods import best_fixed_config
from cutetune.models.predict import predict
from cutetune.space import GemmProblem, KernelConfig, ProblemError, enumerate_configs
from cutetune.space.device import H200
from cutetune.space.features import (GROUPED_FEATURE_NAMES, config_columns,
    grouped_derived_features, grouped_problem_columns)
from cutetune.space.enumerate import sample_configs
from cutetune.space.problem import GroupedProblem
from cutetune.space.suites import moe_problems, random_grouped_problems, routing_counts

DEVICE = "NVIDIA H200"  # the spec the features use; the times are not from one
RUN_ID = "synthetic-test-stand-in"
MODELS = ("deepseek_v3", "qwen3_30b_a3b", "mixtral_8x7b", "granite3.1_1b_a400m")
CONFIGS_PER_PROBLEM = 32
ATEN_SLOWER, ATEN_FASTER, ATEN_SPLIT_ROWS = 1.3, 0.9, 8192
SWEPT = ("granite3.1_1b_a400m_exhaustive", GroupedProblem(32, 256, 1024, 512))


def noiseless_ms(problem: GroupedProblem, configs: list[KernelConfig]) -> np.ndarray:
    cols = {**config_columns(configs), **grouped_problem_columns(problem, len(configs))}
    f = grouped_derived_features(cols, H200)
    tm, tn = cols["tile_m"], cols["tile_n"]
    want_m = np.where(f["rows_per_expert"] < 96, 64, 128)
    penalty = (0.3 * np.abs(np.log2(tm / want_m)) + 0.15 * np.abs(np.log2(tn / 192))
               + 0.06 * (cols["is_dynamic_persistent"] == 0)
               + 0.05 * (cols["cluster_m"] * cols["cluster_n"] > 2)
               + 0.04 * (cols["pingpong"] == 0) * (tm <= 128)
               + 0.03 * (cols["max_swizzle_size"] == 1))
    return f["balanced_roofline_s"] * 1e3 * (1 + penalty) + 0.005


def routed_rows(p: GroupedProblem) -> int:
    return p.m if p.ragged == "m" else p.k


def synthetic_rows(suite: str, p: GroupedProblem, configs, rng, routing: str = "balanced"
                   ) -> list[dict]:
    t = noiseless_ms(p, configs)
    counts = json.dumps(routing_counts(p.experts, routed_rows(p), routing).tolist())
    base = {"device_name": DEVICE, "run_id": RUN_ID, "problem_key": p.key(), "suite": suite,
            **p.to_dict(), "expert_counts": counts}
    rows = [{**base, **c.to_dict(), "backend": "quack", "config_key": c.short(), "status": "ok",
             "time_ms": float(x)} for c, x in zip(configs, t * np.exp(rng.normal(0, 0.01, len(t))))]
    rows.append({**base, **configs[0].to_dict(), "backend": "quack", "config_key": "broken",
                 "status": "compile_error"})
    slower = ATEN_SLOWER if routed_rows(p) <= ATEN_SPLIT_ROWS else ATEN_FASTER
    rows.append({**base, "backend": "aten", "config_key": "", "status": "ok",
                 "time_ms": float(t.min() * slower)})
    return rows


def grouped_problems() -> list[tuple[str, GroupedProblem]]:
    moe = [(s, p) for s, p in moe_problems(tokens=(16, 128, 1024, 8192)) if s in MODELS]
    return moe[::3] + random_grouped_problems(8, seed=3)


def write_synthetic(path, seed: int = 0) -> list[tuple[str, GroupedProblem]]:
    rng = np.random.default_rng(seed)
    problems = grouped_problems()
    rows = []
    for i, (suite, p) in enumerate(problems):
        rows += synthetic_rows(suite, p, sample_configs(p.arch, CONFIGS_PER_PROBLEM, i, p), rng)
    suite, p = SWEPT
    rows += synthetic_rows(suite, p, enumerate_configs(p.arch, p), rng)
    append(path, rows)
    return problems + [SWEPT]


TRAIN = ["--folds", "3", "--trees", "40", "--depth", "4"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Train through the CLI once: (dataset dir, model file, report dir, problems)."""
    root = tmp_path_factory.mktemp("grouped_model")
    problems = write_synthetic(root / "data")
    model, report = root / "model.json", root / "report"
    assert main(["train", str(root / "data"), "--out", str(model), "--report", str(report),
                 *TRAIN]) == 0
    return root / "data", model, report, problems


# ---------------------------------------------------------------- training and its report
def test_grouped_training_meets_synthetic_floors(trained):
    _, _, report, problems = trained
    metrics = json.loads((report / "metrics.json").read_text())
    assert metrics["kind"] == "grouped"
    assert metrics["baseline"] == {"name": "torch._grouped_mm", "backend": "aten"}
    assert metrics["problems"] == len(problems) and metrics["swept"] == 1
    assert metrics["by_layout"] == {}  # majors, but no layouts to judge apart
    chosen = metrics["cv"][metrics["chosen"]]["all"]
    # The best config is a function of the features: a few points under what this set gives.
    assert chosen["top1_geomean"] >= 0.93 and chosen["top1_p10"] >= 0.85
    assert chosen["top5_geomean"] >= 0.97
    for base in ("best_fixed", "quack_default", "roofline", "random"):
        assert chosen["top1_geomean"] > metrics["cv"][base]["all"]["top1_geomean"], base
    # nvMatmulHeuristics has no grouped GEMM to ask; quack's autotune list is dense
    assert not {"nvmmh", "quack_autotune"} & set(metrics["cv"])
    # each MoE model held out whole, its exhaustive sweep with it
    families = {s for s, _ in problems} - {SWEPT[0]}
    assert set(metrics["leave_family_out"][metrics["chosen"]]) == families
    assert all(k == "all" or k == "swept" or k.startswith("M_total ")
               for k in metrics["cv"][metrics["chosen"]])


def test_grouped_fallback_keeps_quack_where_aten_is_slower(trained):
    metrics = json.loads((trained[2] / "metrics.json").read_text())
    shipped = [o for o in metrics["fallback"] if o["quantile"] == metrics["fallback_quantile"]][0]
    # quack wins by ~1.3x on the small problems, ATen by ~1.1x on the large: the mode beats
    # always-ATen and does no worse than always-top-1
    assert shipped["speedup_vs_cublas"] >= 1.1 and shipped["speedup_vs_top1"] >= 1.0
    assert shipped["worst_vs_cublas"] >= 0.85
    buckets = metrics["fallback_by_bucket"]  # the routed rows of 16 to 8192 tokens
    assert list(buckets) == ["M_total 1-1024", "M_total 1025-8192", "M_total 8193-65536"]
    assert buckets["M_total 8193-65536"]["fallback_rate"] >= 0.5
    assert buckets["M_total 1-1024"]["fallback_rate"] <= 0.5
    assert buckets["M_total 1025-8192"]["fallback_rate"] <= 0.5
    targets = {t["what"]: t for t in metrics["targets"]}
    assert set(targets) == {"top1_geomean", "top1_p10", "top1_geomean over best_fixed's",
                            "predicted mode speedup_vs_cublas", "predicted mode worst_vs_cublas"}
    text = (trained[2] / "report.md").read_text()
    for words in ("grouped GEMMs, sm90 bf16", "Leave-one-model-out", "torch._grouped_mm fallback",
                  "By M_total bucket", "Predicted mode by M_total bucket",
                  "nvMatmulHeuristics is not among the baselines", "top-1 vs torch._grouped_mm"):
        assert words in text, words
    assert "cuBLAS" not in text


def test_grouped_dataset_view(trained):
    table = load(trained[0])
    assert set(table.column("schema_version").to_pylist()) == {SCHEMA_VERSION}
    assert set(table.column("backend").to_pylist()) == {"quack", "aten"}
    for name in ("experts", "gemm", "expert_counts"):
        assert table.column(name).null_count == 0, name
    for name in ("batch", "a_major", "b_major"):  # a grouped row's layout follows its gemm
        assert table.column(name).null_count == len(table), name
    data = load_measurements(trained[0])
    assert data.kind is GROUPED and all(isinstance(p, GroupedProblem) for p in data.problems)
    assert data.failed_rows == data.n_problems and np.isfinite(data.cublas_ms).all()
    assert data.m.tolist() == [routed_rows(p) for p in data.problems]
    assert any(p.gemm == "wgrad" for p in data.problems)  # whose routed rows are its K
    X = dataset_features(data, H200)
    assert X.shape == (len(data.time_ms), len(GROUPED_FEATURE_NAMES)) and np.isfinite(X).all()
    assert data.swept.sum() == 1 and np.bincount(data.group)[data.swept][0] == len(
        enumerate_configs("sm90", SWEPT[1]))


def test_a_shape_under_two_routings_is_two_problems_in_one_fold(tmp_path):
    """Each routing's rows are a problem of their own (their configs ran on other work), with
    its own ATen time; cross-validation keeps a shape's routings in one fold; and a model
    trains on such a dataset."""
    rng = np.random.default_rng(0)
    problems = grouped_problems()[:10]
    rows = []
    for i, (suite, p) in enumerate(problems):
        for slower, routing in ((1, "balanced"), (2, "skewed"))[:1 + i % 2]:
            rows += [{**r, "time_ms": r["time_ms"] * slower} if r["backend"] == "aten" else r
                     for r in synthetic_rows(suite, p, sample_configs(p.arch, 8, i, p), rng,
                                             routing)]
    append(tmp_path / "data", rows)
    data = load_measurements(tmp_path / "data")
    assert data.n_problems == 15 and len(set(data.problems)) == 10
    assert data.shapes is not None and len(set(data.shapes.tolist())) == 10
    twice = [p for _, p in problems[1::2]]
    for p in twice:
        mine = [i for i, q in enumerate(data.problems) if q == p]
        assert len(mine) == 2 and len(set(data.shapes[mine])) == 1
        assert sorted(data.cublas_ms[mine] / data.cublas_ms[mine].min()) == [1, 2]
    for k in (2, 3, 10):
        for train, test in data.folds(k, seed=1):
            assert not set(data.shapes[train]) & set(data.shapes[test])
            assert len(train) + len(test) == 15
    with pytest.raises(ValueError, match="11 folds for 10 problems \\(15 with their routings"):
        data.folds(11)
    assert main(["train", str(tmp_path / "data"), "--out", str(tmp_path / "m.json"),
                 *TINY]) == 0


# ---------------------------------------------------------------- one kind per model
TINY = ["--folds", "2", "--trees", "2", "--depth", "2", "--objectives", "regression",
        "--no-baselines", "--no-family-out"]


def test_a_mixed_dataset_is_trained_one_kind_at_a_time(trained, tmp_path, capsys):
    data, rng = tmp_path / "mixed", np.random.default_rng(0)
    for suite, p in trained[3][:10]:  # the fallback's folds need >= 5 ATen times each
        append(data, synthetic_rows(suite, p, enumerate_configs("sm90", p)[:3], rng))
    for m in (128, 256, 512):
        dense = GemmProblem(m, 256, 512)
        append(data, [{"device_name": DEVICE, "run_id": RUN_ID, "problem_key": dense.key(),
                       **dense.to_dict(), "backend": "quack", "config_key": c.short(),
                       **c.to_dict(), "status": "ok", "time_ms": 1.0 + i}
                      for i, c in enumerate(enumerate_configs("sm90", dense)[:4])])
    out = tmp_path / "m.json"
    assert main(["train", str(data), "--out", str(out), *TINY]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and not out.exists()
    assert "holds 3 dense and 10 grouped problems" in err and "--kind grouped" in err
    for kind, problem in (("grouped", trained[3][0][1]), ("dense", GemmProblem(256, 256, 512))):
        assert main(["train", str(data), "--out", str(out), "--kind", kind, *TINY]) == 0
        assert f"({kind} GEMMs, xgb_regression, " in capsys.readouterr().out
        assert load_model(out, kind=kind).rank(problem, top_k=1)


def test_a_dataset_without_the_kind_asked_is_named(trained, tmp_path, capsys):
    assert main(["train", str(trained[0]), "--out", str(tmp_path / "m.json"), "--kind", "dense",
                 "--folds", "2"]) == 2
    err = capsys.readouterr().err
    assert "the dataset holds no dense problems" in err and len(err.splitlines()) == 1


# ---------------------------------------------------------------- the model file
def _sealed(tmp_path, d: dict):
    """``d`` written as a model file with a valid checksum: the checks after it are tested."""
    f = tmp_path / "edited.json"
    f.write_bytes(sealed_json(d))
    return f


def test_grouped_model_file_ranks_grouped_problems_only(trained, tmp_path):
    path = trained[1]
    d = json.loads(path.read_text())
    assert d["kind"] == "grouped" and d["feature_names"] == list(GROUPED_FEATURE_NAMES)
    model = load_model(path, kind="grouped")
    fwd = GroupedProblem(64, 4096, 2048, 1024)
    wgrad = GroupedProblem(64, 2048, 1024, 4096, gemm="wgrad")
    # the whole space of each problem's config family
    assert {c for c, _ in model.rank(fwd)} == set(enumerate_configs("sm90", fwd))
    assert {c for c, _ in model.rank(wgrad)} == set(enumerate_configs("sm90", wgrad))
    assert any(c.swap_ab for c, _ in model.rank(wgrad)) and isinstance(model.prefers_aten(fwd),
                                                                       bool)
    again = load_model(model.save(tmp_path / "again.json"), kind="grouped")
    assert again.scored(wgrad, top_k=5) == model.scored(wgrad, top_k=5)
    with pytest.raises(ProblemError, match="ranks grouped GEMMs; sm90:bf16->bf16:kk:b1:m64:n64"):
        model.rank(GemmProblem(64, 64, 64))
    with pytest.raises(ProblemError, match="cuBLAS runs dense GEMMs"):
        model.prefers_cublas(fwd)
    with pytest.raises(ModelError, match=f"cost model {path} ranks grouped GEMMs, not the "
                                         "requested dense ones"):
        load_model(path)
    with pytest.raises(ModelError, match="ranks dense GEMMs, not the requested grouped ones"):
        load_model(_sealed(tmp_path, {k: v for k, v in d.items() if k != "kind"}),
                   kind="grouped")  # a file without a kind is a dense model's


def test_a_dense_model_refuses_grouped_problems(trained, tmp_path):
    data = load_measurements(trained[0])
    X = dataset_features(data, H200)
    # a booster of dense feature rows (any numbers of that width: it never predicts here)
    dense_rows = BoosterModel(n_estimators=2, max_depth=2).fit(
        X[:, :len(DENSE.feature_names)], data.time_ms, data.group)
    with pytest.raises(ProblemError, match="ranks dense GEMMs; sm90:bf16->bf16:fwd:e8"):
        CostModel("sm90", "bf16", H200, dense_rows, dense_rows).rank(
            GroupedProblem(8, 64, 64, 64))
    grouped = BoosterModel(n_estimators=2, max_depth=2, kind="grouped").fit(
        X, data.time_ms, data.group)
    with pytest.raises(ValueError, match="ranker reads dense problems' features, the time "
                                         "model grouped ones'"):
        CostModel("sm90", "bf16", H200, dense_rows, grouped)
    d = json.loads(trained[1].read_text())
    d["ranker"]["params"]["kind"] = "dense"
    with pytest.raises(ModelError, match="is damaged"):
        load_model(_sealed(tmp_path, d), kind="grouped")


# ---------------------------------------------------------------- cutetune predict
GROUPED_ARGS = ["predict", "--experts", "64", "--m", "4096", "--n", "2048", "--k", "1024"]


def test_predict_cli_ranks_grouped_problems(trained, tmp_path, capsys):
    model = str(trained[1])
    assert main(GROUPED_ARGS + ["--top-k", "3", "--model", model, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"problem", "ordered_by", "ranked", "prefers_aten", "aten_margin",
                        "layout_measured"}
    assert out["layout_measured"] is True
    assert load_model(model, kind="grouped").metadata["trained_on"]["layouts"] == ["kk", "kn", "mn"]
    assert out["problem"] == GroupedProblem(64, 4096, 2048, 1024).to_dict()
    assert [r["rank"] for r in out["ranked"]] == [1, 2, 3]
    assert isinstance(out["prefers_aten"], bool) and (out["aten_margin"] > 0) == out["prefers_aten"]
    top = predict(GroupedProblem(64, 4096, 2048, 1024), 3, model=model)
    assert [c.to_dict() for c, _ in top] == [r["config"] for r in out["ranked"]]

    assert main(GROUPED_ARGS + ["--gemm", "wgrad", "--model", model]) == 0
    text = capsys.readouterr().out
    assert text.startswith("sm90:bf16->bf16:wgrad:e64:m4096:n2048:k1024")
    assert "fallback: use " in text and ("torch._grouped_mm" in text or "top-1 config" in text)

    configs = tmp_path / "c.json"
    configs.write_text(json.dumps([{"tile_m": 64, "tile_n": 128, "cluster_m": 1},
                                   {"tile_m": 128, "tile_n": 192, "is_dynamic_persistent": True}]))
    assert main(GROUPED_ARGS + ["--configs", str(configs), "--model", model, "--json"]) == 0
    ranked = json.loads(capsys.readouterr().out)["ranked"]
    assert sorted(r["config_key"] for r in ranked) == ["128x192pp_c2x1_sw8_dyn",
                                                        "64x128pp_c1x1_sw8"]
    configs.write_text(json.dumps([{"tile_m": 128, "tile_n": 128, "swap_ab": True}]))
    assert main(GROUPED_ARGS + ["--configs", str(configs), "--model", model]) == 2
    assert "varlen_m_no_swap_ab" in capsys.readouterr().err


@pytest.mark.parametrize("extra, words", [
    (["--batch", "2"], "--batch describe dense GEMMs; a grouped GEMM's layout follows --gemm"),
    (["--a-major", "m", "--b-major", "n"], "--a-major, --b-major describe dense GEMMs"),
    (["--experts", "0"], "experts must be a positive integer, got 0"),
    (["--dtype", "fp16"], "no grouped model is shipped for sm90/fp16 yet: train one with "
                          "`cutetune train` on a dataset of grouped measurements"),
])
def test_predict_cli_grouped_errors_are_one_line(trained, capsys, extra, words):
    model = [] if "--dtype" in extra else ["--model", str(trained[1])]
    assert main(GROUPED_ARGS + extra + model) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1, err


def test_predict_cli_gemm_needs_experts_and_models_match_kinds(trained, capsys):
    assert main(["predict", "--m", "64", "--n", "64", "--k", "64", "--gemm", "dgrad"]) == 2
    assert "--gemm names a grouped GEMM: give --experts too" in capsys.readouterr().err
    assert main(["predict", "--m", "64", "--n", "64", "--k", "64",
                 "--model", str(trained[1])]) == 2  # a grouped model asked for a dense GEMM
    assert "ranks grouped GEMMs, not the requested dense ones" in capsys.readouterr().err


# ---------------------------------------------------------------- pieces
@pytest.mark.parametrize("problem", [GemmProblem(200, 4096, 1024, batch=2, b_major="n"),
                                     GroupedProblem(64, 4096, 2048, 1024, gemm="dgrad"),
                                     GroupedProblem(8, 2048, 1024, 40960, gemm="wgrad")])
def test_problem_features_ignore_the_config(problem):
    """What the fallback sees of a problem is the same under every config of its space."""
    kind = kind_of(problem)
    configs = enumerate_configs(problem.arch, problem)
    x = kind.matrix({**config_columns(configs), **kind.columns(problem, len(configs))}, H200)
    per_config = x[:, kind.problem_idx]
    assert (per_config == per_config[0]).all()
    np.testing.assert_array_equal(problem_descriptors([problem], H200)[0], per_config[0])


def test_kinds_baselines_are_the_collectors():
    from cutetune.tuner.measure.collect import baseline_backend

    for kind, problem in ((DENSE, GemmProblem(64, 64, 64)),
                          (GROUPED, GroupedProblem(8, 64, 64, 64))):
        assert baseline_backend(problem) == kind.baseline_backend and kind_of(problem) is kind
    assert set(KINDS) == {"dense", "grouped"}
    assert GROUPED.feature_names[GROUPED.roofline_idx] == "balanced_roofline_s"


def test_best_fixed_config_is_chosen_in_hindsight():
    """Config a is best on two problems, b on one; on the problem that did not measure a, a's
    nearest measured config (a2, one swizzle step away) stands in for it."""
    a, b = KernelConfig(128, 192), KernelConfig(64, 128, cluster_m=1)
    a2 = KernelConfig(128, 192, max_swizzle_size=1)
    rows = [(0, a, 1.0), (0, a2, 1.2), (0, b, 2.0), (1, a, 1.0), (1, b, 1.1), (2, a2, 1.5),
            (2, b, 1.0)]
    cols = config_columns([c for _, c, _ in rows])
    data = Measurements(cols, np.array([t for *_, t in rows]), np.array([g for g, *_ in rows]),
                        (GemmProblem(64, 64, 64),) * 3, np.array(["x"] * 3, dtype=object),
                        np.full(3, np.nan), np.zeros(3, bool), DEVICE)
    assert best_fixed_config(data) == a
    data.time_ms[5] = 3.0  # a's stand-in now loses by 3x: b is the better fixed choice
    assert best_fixed_config(data) == b
