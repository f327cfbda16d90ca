"""Cost model tests on a SYNTHETIC dataset: analytic timings plus noise, not measurements.

The synthetic time is the config's roofline estimate inflated by a smooth tile/mode/cluster
penalty, times lognormal noise; cuBLAS gets the best noiseless config's time times a random
factor. It exists to catch regressions in features, training, evaluation and the artifact;
its metric floors say nothing about real GPUs.
"""

from __future__ import annotations

import base64
import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest

from cutetune.artifacts import sealed_json
from cutetune.cli import main
from cutetune.models.dataset import append
from cutetune.models import CostModel, ModelError, load_model, shipped_model_path
from cutetune.models.data import load_measurements
from cutetune.models.predict import predict
from cutetune.models.evaluate import (group_kfold, leave_family_out, relevance, score_problems,
    summarize)
from cutetune.models.fallback import CublasFallback
from cutetune.models.features import ConfigTable, dataset_features, problem_descriptors
from cutetune.models.baselines import nvmmh_picks, quack_sm90_list
from cutetune.models.learners import BoosterModel
from cutetune.models.train import TrainOptions, train
from cutetune.space import GemmProblem, KernelConfig, enumerate_configs, is_valid, sample_configs
from cutetune.space.device import device_for
from cutetune.space.features import config_columns, derived_features, problem_columns
from cutetune.space.suites import llm_problems, random_problems

SYNTHETIC_DEVICE = "NVIDIA H200"  # the spec the features use; the times are not from one
CONFIGS_PER_PROBLEM = 48


def synthetic_ms(problem: GemmProblem, configs: list[KernelConfig], rng) -> np.ndarray:
    cols = {**config_columns(configs), **problem_columns(problem, len(configs))}
    f = derived_features(cols, device_for(SYNTHETIC_DEVICE))
    tm, tn = cols["tile_m"], cols["tile_n"]
    penalty = (0.25 * np.abs(np.log2(tm * tn / (128 * 192)))      # tiles far from 128x192
               + 0.08 * (1 - cols["pingpong"]) * (tm < 192)        # cooperative small tiles
               + 0.05 * (cols["cluster_m"] * cols["cluster_n"] > 2)
               + 0.04 * (cols["split_k"] - 1) + 0.02 * (cols["max_swizzle_size"] == 1))
    t = f["roofline_s"] * 1e3 * (1 + penalty) / f["wave_efficiency"] ** 0.3 + 0.004
    return t * np.exp(rng.normal(0, 0.02, len(t)))


def write_synthetic(path, n_random: int = 36, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    llm = [x for x in llm_problems() if x[0] in ("llama3_8b", "qwen2.5_72b")][::3]
    problems = llm + random_problems(n_random, seed=seed)
    rows = []
    swept = GemmProblem(64, 1024, 64)  # K = one K tile: no split-K, ~800 valid configs
    for i, (suite, p) in enumerate(problems + [("llama3_8b_exhaustive", swept)]):
        configs = (enumerate_configs(p.arch, p) if p is swept
                   else sample_configs(p.arch, CONFIGS_PER_PROBLEM, seed=i, problem=p))
        times = synthetic_ms(p, configs, rng)
        base = {"device_name": SYNTHETIC_DEVICE, "run_id": "synthetic", "problem_key": p.key(),
                "suite": suite, **p.to_dict()}
        for c, t in zip(configs, times):
            rows.append({**base, **c.to_dict(), "backend": "quack", "config_key": c.short(),
                         "status": "ok", "time_ms": float(t)})
        rows.append({**base, "backend": "quack", "config_key": "broken", **configs[0].to_dict(),
                     "status": "compile_error"})
        rows.append({**base, "backend": "cublas", "config_key": "", "status": "ok",
                     "time_ms": float(times.min() * rng.uniform(0.9, 1.15))})
    append(path, rows)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Train through the CLI once: (dataset dir, model file, report dir)."""
    root = tmp_path_factory.mktemp("cost_model")
    write_synthetic(root / "data")
    model, report = root / "model.json", root / "report"
    rc = main(["train", str(root / "data"), "--out", str(model), "--report", str(report),
               "--folds", "4", "--trees", "60", "--depth", "6"])
    assert rc == 0
    return root / "data", model, report


def test_dense_training_tries_regression_and_pairwise_by_default(trained):
    """The dense kind's objectives (KIND_DEFAULTS): NDCG is not fit unless asked for."""
    metrics = json.loads((trained[2] / "metrics.json").read_text())
    assert {k for k in metrics["cv"] if k.startswith("xgb_")} == {"xgb_regression", "xgb_pairwise"}


def test_objectives_option_keeps_regression_and_defaults_to_the_kinds(trained):
    import argparse

    from cutetune.commands.train import add_arguments, options_from

    p = argparse.ArgumentParser()
    add_arguments(p)
    parse = lambda *a: options_from(p.parse_args(["data", "--out", "m.json", *a]))  # noqa: E731
    assert parse().objectives is None
    assert parse("--objectives", "rank:ndcg").objectives == ("regression", "rank:ndcg")
    assert parse("--objectives", "").objectives == ("regression",)
    with pytest.raises(ValueError, match="regression objective is required"):
        train(load_measurements(trained[0]), TrainOptions(objectives=("rank:pairwise",)))


def test_held_out_metrics_above_floor(trained):
    _, _, report = trained
    metrics = json.loads((report / "metrics.json").read_text())
    chosen = metrics["cv"][metrics["chosen"]]["all"]
    # Floors sit a few points under what this synthetic set gives (top-1 ~0.96, top-5 ~0.99).
    assert chosen["top1_geomean"] >= 0.93
    assert chosen["top5_geomean"] >= 0.97
    assert chosen["kendall_tau"] >= 0.6
    for base in ("random", "quack_default", "roofline"):
        assert chosen["top1_geomean"] > metrics["cv"][base]["all"]["top1_geomean"], base
    # The full sweep of a llama3_8b layer is held out with its family, not as a family of its own.
    assert set(metrics["leave_family_out"][metrics["chosen"]]) == {"llama3_8b", "qwen2.5_72b",
                                                                   "random"}
    assert metrics["swept"] == 1 and metrics["cv"]["nvmmh"]["swept"]["problems"] == 1
    assert metrics["coverage"]["quack_default"] < 0.2  # sampled problems rarely hold it
    assert [o["quantile"] for o in metrics["fallback"]] == [0.5, 0.75, 0.9]
    text = (report / "report.md").read_text()
    assert "Leave-one-family-out" in text and "cuBLAS fallback" in text and "Fully swept" in text


def test_artifact_round_trip(trained, tmp_path):
    _, path, _ = trained
    model = load_model(path)
    assert model.metadata["trained_on"]["sha256"]
    again = tmp_path / "again.json"
    model.save(again)
    other = load_model(again)
    gz = model.save(tmp_path / "again.json.gz")  # gzipped, as its name says, and read back
    assert gz.read_bytes()[:2] == b"\x1f\x8b" and load_model(gz).to_dict() == other.to_dict()
    p = GemmProblem(256, 4096, 4096)
    configs = enumerate_configs("sm90", p)[:50]
    np.testing.assert_array_equal(model.predict_log_time(p, configs),
                                  other.predict_log_time(p, configs))
    ranked = model.rank(p, top_k=20)
    assert len(ranked) == 20 and all(is_valid(c, "sm90", p) for c, _ in ranked)
    full = model.rank(p)
    assert {c for c, _ in full} == set(enumerate_configs("sm90", p))
    assert isinstance(model.prefers_cublas(p), bool)


def test_ranker_artifact_keeps_a_time_model(trained, tmp_path):
    """A ranking objective predicts no time: the artifact pairs it with a regression timer."""
    data = load_measurements(trained[0])
    X = dataset_features(data, device_for(data.device_name))
    fit = lambda obj: BoosterModel(obj, n_estimators=20, max_depth=4).fit(  # noqa: E731
        X, data.time_ms, data.group)
    model = CostModel("sm90", "bf16", device_for("sm90"), fit("rank:pairwise"), fit("regression"))
    loaded = load_model(model.save(tmp_path / "ranker.json"))
    assert loaded.ranker.objective == "rank:pairwise" and loaded.timer.predicts_time
    p = GemmProblem(512, 2048, 1024)
    ranked = loaded.rank(p, top_k=5)
    assert ranked == model.rank(p, top_k=5)
    timer_ms = np.exp(loaded.predict_log_time(p, [c for c, _ in ranked]))
    np.testing.assert_allclose(timer_ms, [ms for _, ms in ranked], rtol=1e-6)
    with pytest.raises(ModelError, match="trained without cuBLAS"):
        loaded.prefers_cublas(p)



def test_blended_artifact_orders_by_ranker_plus_weighted_time(trained, tmp_path):
    """A timer weight orders by the ranker's score plus weight x the time model's log time,
    survives the file, and is refused where there is no separate ranker to blend."""
    data = load_measurements(trained[0])
    X = dataset_features(data, device_for(data.device_name))
    fit = lambda obj: BoosterModel(obj, n_estimators=20, max_depth=4).fit(  # noqa: E731
        X, data.time_ms, data.group)
    ranker, timer = fit("rank:pairwise"), fit("regression")
    model = CostModel("sm90", "bf16", device_for("sm90"), ranker, timer, timer_weight=4.0)
    loaded = load_model(model.save(tmp_path / "blend.json"))
    assert loaded.timer_weight == 4.0 and loaded.ordering == "rank:pairwise+4*regression"
    p = GemmProblem(512, 2048, 1024)
    configs = enumerate_configs("sm90", p)[:200]
    scored = loaded.scored(p, configs)
    Xp = ConfigTable.of(configs).features(p, loaded.device)
    expected = ranker.predict(Xp) + 4.0 * timer.predict(Xp)
    np.testing.assert_allclose([s for _, s, _ in scored], np.sort(expected), rtol=1e-6)
    np.testing.assert_allclose(np.log([ms for _, _, ms in scored]),
                               loaded.predict_log_time(p, [c for c, _, _ in scored]), rtol=1e-6)
    assert scored != load_model(CostModel("sm90", "bf16", device_for("sm90"), ranker, timer)
                                .save(tmp_path / "plain.json")).scored(p, configs)
    with pytest.raises(ValueError, match="ranker is the time model"):
        CostModel("sm90", "bf16", device_for("sm90"), timer, timer, timer_weight=1.0)

def _write(tmp_path, name, d):
    f = tmp_path / name
    f.write_text(d if isinstance(d, str) else json.dumps(d))
    return f


@pytest.mark.parametrize("mutate, message", [
    (lambda d: "{not json", "not readable JSON"),
    (lambda d: {**d, "format": "something"}, "not a cutetune cost model"),
    (lambda d: {**d, "arch": "sm100"}, "is for sm100/bf16"),
    (lambda d: {**d, "format_version": 99}, "format version 99"),
    (lambda d: {**d, "feature_names": d["feature_names"][:-1]}, "another feature schema"),
    (lambda d: {**d, "ranker": {**d["ranker"], "booster_ubj_zlib_base64": "!!"}}, "damaged"),
    (lambda d: {**d, "ranker": {**d["ranker"], "booster_ubj_zlib_base64": "AAAA"}}, "damaged"),
])
def test_bad_artifacts_raise_clear_errors(trained, tmp_path, mutate, message):
    d = json.loads(trained[1].read_text())
    bad = mutate(d)
    f = tmp_path / "bad.json"  # sealed: the checks after the checksum's are tested too
    f.write_bytes(bad.encode() if isinstance(bad, str) else sealed_json(bad))
    with pytest.raises(ModelError, match=message) as e:
        load_model(f)
    assert str(f) in str(e.value)


def test_missing_model_errors(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        load_model(tmp_path / "nope.json")
    with pytest.raises(ModelError, match="cutetune train"):
        load_model(None, arch="sm100", dtype="fp16")


def tiny_model(trained) -> CostModel:
    """A few-tree ranker, timer and fallback: a model file of a few KB with all three kinds
    of booster, for tests that go through every byte of one."""
    data = load_measurements(trained[0])
    X = dataset_features(data, device_for(data.device_name))
    fit = lambda obj: BoosterModel(obj, n_estimators=2, max_depth=2).fit(  # noqa: E731
        X, data.time_ms, data.group)
    width = problem_descriptors(data.problems[:1], device_for("sm90")).shape[1] + 1
    fallback = CublasFallback(n_estimators=2, max_depth=2).fit(
        np.random.default_rng(0).normal(size=(20, width)).astype(np.float32),
        np.linspace(-1, 1, 20))
    return CostModel("sm90", "bf16", device_for("sm90"), fit("rank:pairwise"), fit("regression"),
                     fallback)


def test_every_byte_of_a_model_file_is_checked(trained, tmp_path):
    """A byte changed anywhere in a model file (a stride across all of it: header, the three
    boosters' base64, metadata, the checksum itself) is refused with a ModelError naming the
    file, before XGBoost sees a booster (its loader can crash the process on a changed
    byte): the checksum covers every byte, so none loads with changed predictions."""
    path = tiny_model(trained).save(tmp_path / "m.json")
    raw = path.read_bytes()
    p = GemmProblem(512, 2048, 1024)
    expected = load_model(path).scored(p, top_k=5)
    refused = 0
    positions = range(0, len(raw), max(1, len(raw) // 300))
    for pos in positions:
        bad = bytearray(raw)
        bad[pos] ^= (0x01, 0x20, 0x80)[pos % 3]
        path.write_bytes(bytes(bad))
        try:
            got = load_model(path).scored(p, top_k=5)
        except ModelError as e:
            assert str(path) in str(e)
            refused += 1
        else:
            assert got == expected, f"byte {pos} changed the predictions"
    assert refused == len(positions) >= 300
    path.write_bytes(raw)
    assert load_model(path).scored(p, top_k=5) == expected


def test_a_format_2_model_file_still_loads(trained, tmp_path):
    """Format 3 deflates the boosters (a third of the file); a format-2 file, the same but for
    plain UBJ, loads and predicts the same."""
    model = tiny_model(trained)
    d = model.to_dict()
    assert d["format_version"] == 3 and "booster_ubj_zlib_base64" in d["ranker"]
    for part in ("ranker", "timer", "fallback"):
        d[part] = {"params": d[part]["params"], "booster_ubj_base64": base64.b64encode(
            bytes(getattr(model, part).booster.save_raw(raw_format="ubj"))).decode("ascii")}
    old = tmp_path / "v2.json"
    old.write_bytes(sealed_json({**d, "format_version": 2}))
    p = GemmProblem(512, 2048, 1024)
    assert load_model(old).scored(p, top_k=5) == load_model(
        model.save(tmp_path / "v3.json")).scored(p, top_k=5)
    assert (tmp_path / "v3.json").stat().st_size < old.stat().st_size


def test_old_format_and_directory_model_errors(trained, tmp_path):
    d = {k: v for k, v in json.loads(trained[1].read_text()).items() if k != "checksum"}
    old = _write(tmp_path, "v1.json", {**d, "format_version": 1})
    with pytest.raises(ModelError, match="format version 1; this cutetune reads version 2 or 3 "
                                         r"\(retrain it with `cutetune train`\)"):
        load_model(old)
    assert main(["predict", "--m", "64", "--n", "64", "--k", "64", "--model", str(tmp_path)]) == 2
    with pytest.raises(ModelError, match=f"cost model {tmp_path} is a directory; give the file"):
        load_model(tmp_path)


def test_predict_cli_and_function(trained, tmp_path, capsys):
    _, path, _ = trained
    assert main(["predict", "--m", "64", "--n", "4096", "--k", "4096", "--top-k", "3",
                 "--model", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in out["ranked"]] == [1, 2, 3]
    ms = [r["predicted_ms"] for r in out["ranked"]]
    assert ms == sorted(ms) and isinstance(out["prefers_cublas"], bool)
    p = GemmProblem(64, 4096, 4096)
    top = predict(p, 3, model=path)
    assert [c.to_dict() for c, _ in top] == [r["config"] for r in out["ranked"]]

    configs = _write(tmp_path, "c.json", [{"tile_m": 128, "tile_n": 128, "cluster_m": 1},
                                          {"tile_m": 64, "tile_n": 64, "pingpong": False,
                                           "device_capacity": 9}])
    assert main(["predict", "--m", "64", "--n", "4096", "--k", "4096", "--configs", str(configs),
                 "--model", str(path)]) == 0
    text = capsys.readouterr().out
    assert "128x128pp_c1x1" in text and "64x64co_c2x1" in text and "fallback:" in text

    bad = _write(tmp_path, "bad.json", [{"tile_m": 128, "tile_q": 1}])
    assert main(["predict", "--m", "64", "--n", "4096", "--k", "4096", "--configs", str(bad),
                 "--model", str(path)]) == 2
    assert "unknown config field(s): tile_q" in capsys.readouterr().err
    invalid = _write(tmp_path, "inv.json", [{"tile_m": 256, "tile_n": 256, "pingpong": True}])
    assert main(["predict", "--m", "64", "--n", "4096", "--k", "4096", "--configs", str(invalid),
                 "--model", str(path)]) == 2
    assert "sm90_tile_m" in capsys.readouterr().err


def test_a_layout_the_model_never_measured_runs_cublas(trained, tmp_path, capsys):
    """The synthetic data holds only unbatched kk problems: for an mn or a batched problem the
    model extrapolates, so predicted mode runs cuBLAS whatever the fallback says; the ranking
    (reduced mode's candidates) is the model's still. An older file keeps no layouts and
    decides by the fallback alone."""
    _, path, _ = trained
    model = load_model(path)
    assert model.metadata["trained_on"]["layouts"] == ["kk"]
    kk, mn, bmm = (GemmProblem(2048, 4096, 4096), GemmProblem(2048, 4096, 4096, a_major="m",
                   b_major="n"), GemmProblem(2048, 4096, 4096, batch=4))
    assert [model.measured_layout(p) for p in (kk, mn, bmm)] == [True, False, False]
    assert model.prefers_cublas(mn) and model.prefers_cublas(bmm)
    assert model.picks([kk, mn, bmm])[1:] == [None, None] and model.rank(bmm, top_k=1)
    model.metadata["trained_on"].pop("layouts")
    assert model.measured_layout(bmm)
    assert model.prefers_cublas(bmm) == (model.aten_margin(bmm) > 0)

    assert main(["predict", "--m", "2048", "--n", "4096", "--k", "4096", "--batch", "4",
                 "--model", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layout_measured"] is False and out["prefers_cublas"] is True
    assert main(["predict", "--m", "2048", "--n", "4096", "--k", "4096", "--batch", "4",
                 "--model", str(path)]) == 0
    text = capsys.readouterr().out  # the fallback's own verdict, then the rule that overrides it
    assert f"fallback: use the top-1 config (margin {model.aten_margin(bmm):+.3f}" in text
    assert "no problem of layout 'kk bmm': predicted mode runs cuBLAS" in text


@pytest.mark.parametrize("configs, words", [
    ([{"tile_m": 128, "pingpong": "false"}], ["config #0", "pingpong must be true or false"]),
    ([{"tile_m": 128}, {"tile_m": 128.9}], ["config #1", "tile_m must be an integer, got 128.9"]),
    ([{"tile_m": 128, "cluster_k": 2}], ["config #0", "cluster_k=2", "does not tune cluster_k"]),
    ([{"tile_m": 128, "num_warps": 4}], ["num_warps=4"]),
    ([{"tile_m": 64, "tile_k": 64}], ["tile_k=64"]),
    ([{"tile_m": 128, "device_capacity": 10}], ["device_capacity=10 is not sm90's (9)"]),
    ([{"tile_n": 128}, {"tile_m": 64}, {"tile_n": 128, "cluster_k": 1}],
     ["config #2 repeats config #0 (128x128pp_c2x1_sw8)"]),
])
def test_predict_reads_configs_strictly(trained, tmp_path, capsys, configs, words):
    """A config read loosely would be another kernel ranked without a word: refused, naming
    the file and the entry."""
    f = _write(tmp_path, "c.json", configs)
    assert main(["predict", "--m", "64", "--n", "4096", "--k", "4096", "--configs", str(f),
                 "--model", str(trained[1])]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"cutetune predict: error: {f}: ")
    for w in words:
        assert w in err


@pytest.mark.parametrize("m", [10**12, 10**30])
def test_predict_refuses_sizes_no_device_holds(trained, capsys, m):
    assert main(["predict", "--m", str(m), "--n", "4096", "--k", "4096",
                 "--model", str(trained[1])]) == 2
    err = capsys.readouterr().err
    assert "more than any sm90 device holds (H200: 141 GiB)" in err and len(err.splitlines()) == 1


def test_predict_shows_the_order_it_ranks_by(trained, tmp_path, capsys):
    """With a ranking objective the rank follows the ranker's score, shown beside the time
    model's ms (a second model, not monotone in the rank): the header says which is which."""
    path = tiny_model(trained).save(tmp_path / "m.json")
    argv = ["predict", "--m", "512", "--n", "2048", "--k", "1024", "--top-k", "8",
            "--model", str(path)]
    assert main(argv + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    scores = [r["score"] for r in out["ranked"]]
    assert out["ordered_by"] == "rank:pairwise" and scores == sorted(scores)
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("ranked by the rank:pairwise model's score (lower is better)")
    assert lines[2].split() == ["rank", "config", "score", "est.", "ms", "TFLOP/s"]
    shown = [float(line.split()[2]) for line in lines[3:11]]
    assert shown == sorted(shown)


TINY_TRAIN = ["--folds", "2", "--trees", "3", "--depth", "2", "--objectives", "regression",
              "--no-baselines", "--no-family-out"]


@pytest.mark.parametrize("out, report, words", [
    ("{tmp}", None, ["model file {tmp} is a directory; give a file path"]),
    ("{tmp}/m.json", "{tmp}/file", ["report folder {tmp}/file is a file; give a folder"]),
    ("{tmp}/file/m.json", None, ["cannot write model file {tmp}/file/m.json"]),
])
def test_train_outputs_are_checked_before_the_work(tmp_path, capsys, out, report, words):
    """The dataset does not even exist: the output's error comes first, not after training."""
    (tmp_path / "file").write_text("x")
    argv = ["train", str(tmp_path / "no-dataset"), "--out", out.format(tmp=tmp_path)]
    assert main(argv + (["--report", report.format(tmp=tmp_path)] if report else [])) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    for w in words:
        assert w.format(tmp=tmp_path) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_train_output_on_a_read_only_filesystem(capsys, read_only_dir):
    out = f"{read_only_dir}/cutetune-model.json"
    assert main(["train", "no-dataset", "--out", out]) == 2
    assert f"cannot write model file {out}: " in capsys.readouterr().err


def test_a_full_disk_keeps_what_was_written_and_no_temporary(trained, tmp_path, capsys,
                                                             monkeypatch):
    """ENOSPC while the report is written: a clear error, the model file written before it
    kept, no temporary file left."""
    import cutetune.artifacts as artifacts

    real_open = open

    def full_disk(path, mode="r", *a, **kw):
        f = real_open(path, mode, *a, **kw)
        if "metrics.json" in str(path) and "w" in mode:
            f.close()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return f

    monkeypatch.setattr(artifacts, "open", full_disk, raising=False)
    model, report = tmp_path / "m.json", tmp_path / "report"
    assert main(["train", str(trained[0]), "--out", str(model), "--report", str(report),
                 *TINY_TRAIN]) == 2
    err = capsys.readouterr().err
    assert f"no space left on the device writing report file {report / 'metrics.json'}" in err
    assert load_model(model).rank(GemmProblem(64, 64, 64), top_k=1)
    leftovers = [p.name for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []


def _bad_dataset(tmp_path, **changes) -> Path:
    p = GemmProblem(128, 256, 512)
    rows = [{"device_name": SYNTHETIC_DEVICE, "problem_key": p.key(), **p.to_dict(),
             "backend": "quack", "config_key": c.short(), **c.to_dict(), "status": "ok",
             "time_ms": 1.0 + i} for i, c in enumerate(enumerate_configs("sm90", p)[:4])]
    rows[2].update(changes)
    append(tmp_path / "data", rows)
    return tmp_path / "data"


@pytest.mark.parametrize("time_ms, shown", [(float("nan"), "nan"), (-1.0, "-1.0"), (0.0, "0.0")])
def test_training_data_with_a_bad_time_is_named(tmp_path, capsys, time_ms, shown):
    data = _bad_dataset(tmp_path, time_ms=time_ms)
    assert main(["train", str(data), "--out", str(tmp_path / "m.json"), *TINY_TRAIN]) == 2
    err = capsys.readouterr().err
    assert "dataset part " + str(data / "part-") in err
    assert f"column time_ms of ok row 2 is {shown}" in err and len(err.splitlines()) == 1


def test_training_data_with_a_wrong_column_type_is_named(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = _bad_dataset(tmp_path)
    (written,) = data.glob("part-*.parquet")
    t = pq.read_table(written)
    t = t.set_column(t.schema.get_field_index("tile_n"), "tile_n",
                     pa.array([str(v) + "px" for v in t.column("tile_n").to_pylist()]))
    written.unlink()
    part = data / "part-000000-anywhere.parquet"  # written by another tool: no digest to check
    pq.write_table(t, part)
    assert main(["train", str(data), "--out", str(tmp_path / "m.json"), *TINY_TRAIN]) == 2
    err = capsys.readouterr().err
    assert f"dataset part {part}: column tile_n has type string, not int32" in err


def test_dataset_view(trained):
    data = load_measurements(trained[0])
    assert data.failed_rows == data.n_problems  # one compile_error row per problem
    assert np.isfinite(data.cublas_ms).all()
    assert (np.diff(data.group) >= 0).all() and data.group.max() == data.n_problems - 1
    sizes = np.bincount(data.group)
    assert sorted(set(sizes.tolist()))[0] == CONFIGS_PER_PROBLEM
    assert data.swept.tolist().count(True) == 1 and sizes[data.swept][0] > 500


# ---------------------------------------------------------------- evaluation, pure
@pytest.mark.parametrize("k, seed", [(2, 0), (4, 1), (5, 7)])
def test_group_kfold_never_leaks(k, seed):
    splits = group_kfold(23, k, seed)
    tests = np.concatenate([te for _, te in splits])
    assert sorted(tests.tolist()) == list(range(23))  # every problem tested exactly once
    for train, test in splits:
        assert not set(train) & set(test)
        assert len(train) + len(test) == 23


def test_leave_family_out_and_leak_check(trained):
    fams = np.array(["a", "b", "a", "c"])
    splits = leave_family_out(fams)
    assert [(f, te.tolist()) for f, _, te in splits] == [("a", [0, 2]), ("b", [1]), ("c", [3])]
    from cutetune.models.crossval import held_out_scores
    from cutetune.models.methods import Method

    data = load_measurements(trained[0])
    method = Method("zero", "", lambda d, X: np.zeros(len(X)))
    with pytest.raises(ValueError, match="both train and test"):
        held_out_scores(data, np.zeros((len(data.time_ms), 1)), method,
                        [(np.array([0, 1]), np.array([1, 2]))])


def test_held_out_scores_reports_each_fold(trained):
    """The progress hook of `cutetune train`'s bars: one call per fold, after its scores."""
    from cutetune.models.crossval import held_out_scores
    from cutetune.models.methods import Method

    data = load_measurements(trained[0])
    events = []

    def score(d, X):
        events.append("score")
        return np.zeros(len(X))

    h = held_out_scores(data, np.zeros((len(data.time_ms), 1)), Method("zero", "", score),
                        group_kfold(data.n_problems, 3, 0), on_fold=lambda: events.append("fold"))
    assert events == ["score", "fold"] * 3 and np.isfinite(h.row_scores).all()


def test_problem_metrics():
    t = np.array([1.0, 2.0, 4.0, 1.5, 3.0])
    group = np.array([0, 0, 0, 1, 1])
    perfect = score_problems(t, t, group, np.array([10, 5000]), np.array([2.0, np.nan]))
    s = summarize(perfect)
    assert s["top1_geomean"] == 1.0 and s["kendall_tau"] == 1.0 and s["ndcg@5"] == 1.0
    assert s["vs_cublas_geomean"] == 2.0  # only problem 0 has a cuBLAS time
    worst = score_problems(t, -t, group, np.array([10, 5000]), np.array([2.0, 3.0]))
    np.testing.assert_allclose(worst.eff[1], [0.25, 0.5])
    np.testing.assert_allclose(worst.eff[5], [1.0, 1.0])
    assert summarize(worst)["kendall_tau"] == -1.0
    assert relevance(np.array([1.0, 1.005, 1.02, 1.5]), 1.0).tolist() == [5, 5, 4, 0]


def test_baseline_configs_map_into_the_space():
    mapped = quack_sm90_list()
    assert len(mapped) == 44 and all(is_valid(c, "sm90") for c in mapped)
    picks = nvmmh_picks(GemmProblem(16, 4096, 4096))
    assert picks and any(c.swap_ab for c in picks) and any(not c.swap_ab for c in picks)
    # a batched problem is asked as one: 64 small GEMMs fill the GPU as one large one does
    one, batched = (nvmmh_picks(GemmProblem(1024, 1024, 128, batch=b)) for b in (1, 64))
    assert one != batched


def test_fallback_quantile_is_calibrated():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 3)).astype(np.float32)
    y = 0.3 * X[:, 0] + rng.normal(0, 0.1, 600)
    model = CublasFallback(quantile=0.8).fit(X[:300], y[:300])
    coverage = np.mean(y[300:] <= model.predict(X[300:]))
    assert 0.7 <= coverage <= 0.9
    again = CublasFallback.from_dict(model.to_dict())
    np.testing.assert_array_equal(again.predict(X[:5]), model.predict(X[:5]))


def test_fallback_classifier_runs_the_pick_where_it_is_likely_faster():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 3)).astype(np.float32)
    y = 0.3 * X[:, 0] + rng.normal(0, 0.1, 600)  # the pick wins where X[:, 0] < 0
    model = CublasFallback(quantile=0.75, objective="classifier").fit(X[:300], y[:300])
    falls_back = model.predict(X[300:]) > 0
    assert np.mean(falls_back == (X[300:, 0] > 0)) > 0.85
    assert np.mean(y[300:][~falls_back] < 0) > 0.9  # runs the pick mostly where it wins
    again = CublasFallback.from_dict(model.to_dict())
    np.testing.assert_array_equal(again.predict(X[:5]), model.predict(X[:5]))


def test_fallback_files_without_an_objective_load_as_the_quantile_model():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(50, 2)).astype(np.float32), rng.normal(size=50)
    d = CublasFallback(n_estimators=2).fit(X, y).to_dict()
    del d["params"]["objective"]
    assert CublasFallback.from_dict(d).objective == "quantile"
    d["params"]["objective"] = "ranker"
    with pytest.raises(ValueError, match="unknown fallback objective"):
        CublasFallback.from_dict(d)


@pytest.mark.parametrize("objective", ["quantile", "classifier"])
def test_a_fallback_fit_serves_every_level(objective):
    """``at`` moves the level of a fitted fallback as a fit at that level would set it."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3)).astype(np.float32)
    y = 0.3 * X[:, 0] + rng.normal(0, 0.1, 200)
    fit = CublasFallback(0.5, n_estimators=10, objective=objective).fit(X, y)
    for q in (0.5, 0.75, 0.9):
        direct = CublasFallback(q, n_estimators=10, objective=objective).fit(X, y)
        np.testing.assert_array_equal(fit.at(q).predict(X), direct.predict(X))
        assert fit.at(q).to_dict() == direct.to_dict()


@pytest.mark.parametrize("fallback", ["quantile", "classifier"])
def test_training_fits_each_booster_once_per_fold(trained, monkeypatch, fallback):
    """A blend is judged on its ranker's and the regression's fold models, and the fallback
    on one fit per fold for all its levels: no booster is fit twice on the same rows."""
    import xgboost

    from cutetune.models.crossval import held_out_scores
    from cutetune.models.fallback import CALIBRATION_FOLDS
    from cutetune.models.methods import BLEND_NAMES, blend_method

    fits, xgb_train = {}, xgboost.train

    def counted(params, *args, **kwargs):
        fits[params["objective"]] = fits.get(params["objective"], 0) + 1
        return xgb_train(params, *args, **kwargs)

    monkeypatch.setattr(xgboost, "train", counted)
    data, folds = load_measurements(trained[0]), 3
    model, ev = train(data, TrainOptions(folds=folds, n_estimators=4, max_depth=3,
                                         baselines=False, family_out=False, timer_weight=1.0,
                                         fallback_objective=fallback,
                                         objectives=("regression", "rank:pairwise", "rank:ndcg")))
    assert set(BLEND_NAMES.values()) <= set(ev.cv) and len(ev.fallback) == 3
    fallback_fits = folds + 1  # its folds' and the shipped one's
    assert fits == {  # each objective per fold, the shipped model's ranker and time model
        "rank:pairwise": folds + (model.ranker.objective == "rank:pairwise"),
        "rank:ndcg": folds + (model.ranker.objective == "rank:ndcg"),
        "reg:squarederror": folds + 1 + (fallback_fits * (CALIBRATION_FOLDS + 1)
                                         if fallback == "quantile" else 0),
        **({"binary:logistic": fallback_fits} if fallback == "classifier" else {})}
    blend = blend_method("rank:pairwise", 1.0, n_estimators=4, max_depth=3)
    X = dataset_features(data, device_for(data.device_name))
    np.testing.assert_array_equal(
        ev.cv[blend.name].row_scores,
        held_out_scores(data, X, blend, group_kfold(data.n_problems, folds, 0)).row_scores)


SHIPPED_DATASET = Path(__file__).resolve().parents[1] / "data" / "inputs" / "h200_bf16"
# Floors for the small CI model (100 trees, 3 folds), a couple of points under what it reaches;
# the full model's numbers are in data/reports/model_h200_bf16/metrics.json.
FLOOR_TOP1, FLOOR_TOP5 = 0.93, 0.975


@pytest.mark.skipif(not SHIPPED_DATASET.is_dir(), reason="no measured dataset in this checkout")
def test_measured_h200_dataset_held_out_floor():
    """A small model on the committed H200 measurements must keep its held-out quality."""
    data = load_measurements(SHIPPED_DATASET)
    _, ev = train(data, TrainOptions(folds=3, n_estimators=100, baselines=False,
                                     family_out=False, objectives=("regression",)))
    s = ev.cv_summary[ev.chosen]["all"]
    assert s["top1_geomean"] >= FLOOR_TOP1 and s["top5_geomean"] >= FLOOR_TOP5, s


@pytest.mark.skipif(not shipped_model_path().is_file(), reason="no shipped model in this checkout")
def test_shipped_model_matches_this_cutetune():
    """A change to the features or the artifact format must come with a retrained model."""
    model = load_model()
    p = GemmProblem(128, 4096, 4096)
    ranked = model.rank(p, top_k=3)
    assert len(ranked) == 3 and all(ms > 0 for _, ms in ranked)
    assert model.metadata["trained_on"]["sha256"]


H100 = "NVIDIA H100 80GB HBM3"  # torch's name for it


@pytest.mark.skipif(shipped_model_path(device=H100) == shipped_model_path(),
                    reason="no model shipped for the H100 in this checkout")
def test_predict_ranks_with_the_model_shipped_for_the_named_gpu(capsys):
    """--device names the GPU: an H100 gets the model measured on it (features on its spec),
    an H200, or no --device, the arch's; a GPU without a spec is refused by name."""
    assert load_model(shipped_model_path(device=H100)).device.name == "H100_SXM"
    assert shipped_model_path(device="H200") == shipped_model_path()
    assert load_model().device.name == "H200"
    args = ["predict", "--m", "4096", "--n", "4096", "--k", "14336", "--a-major", "m",
            "--b-major", "n", "--json"]
    out = {}
    for device in ("H100", "H200", None):
        assert main(args + (["--device", device] if device else [])) == 0
        out[device] = json.loads(capsys.readouterr().out)["ranked"]
    assert out["H200"] == out[None] != out["H100"]
    for bad, says in ((["--device", "H100 PCIe"], "unknown device 'H100 PCIe'"),
                      (["--device", "B200"], "--device B200 is an sm100 GPU, the problem sm90"),
                      (["--device", "H100", "--model", "m.json"], "give one")):
        assert main(args + bad) == 2
        assert says in capsys.readouterr().err


def _write_layouts(path, layouts, n: int = 12, configs: int = 8, dtype: str = "bf16",
                   seed: int = 1, device: str = SYNTHETIC_DEVICE) -> None:
    """Synthetic measurements of ``n`` random layers (drawn by ``seed``) in ``dtype`` and
    ``layouts``."""
    from cutetune.space.suites import in_layouts

    rng = np.random.default_rng(0)
    problems = in_layouts(random_problems(n, seed=seed, dtype=dtype), layouts)
    rows = []
    for i, (suite, p) in enumerate(problems):
        sampled = sample_configs(p.arch, configs, seed=i, problem=p)
        base = {"device_name": device, "run_id": "synthetic", "problem_key": p.key(),
                "suite": suite, **p.to_dict()}
        rows += [{**base, **c.to_dict(), "backend": "quack", "config_key": c.short(),
                  "status": "ok", "time_ms": float(t)}
                 for c, t in zip(sampled, synthetic_ms(p, sampled, rng))]
    append(path, rows)


def test_a_dense_size_in_two_layouts_shares_a_fold(tmp_path):
    """kk and mk of one size are two problems of one shape: cross-validation keeps them in
    one fold; a layer's gradients (other sizes) are shapes of their own."""
    from cutetune.space.suites import in_layouts

    problems = in_layouts(random_problems(12, seed=1), ["kk", "mk", "kn"])
    _write_layouts(tmp_path / "d", ["kk", "mk", "kn"])
    data = load_measurements(tmp_path / "d")
    sizes = {(p.m, p.n, p.k) for p in data.problems}
    assert data.n_problems == len(problems) and data.shapes is not None
    assert len(set(data.shapes.tolist())) == len(sizes) < data.n_problems
    for train_idx, test_idx in data.folds(3, seed=2):
        assert not set(data.shapes[train_idx]) & set(data.shapes[test_idx])


def test_each_layout_is_judged_on_its_own(tmp_path):
    """A dataset of several layouts gets held-out metrics, targets and a table per layout (the
    issue's floors hold for each); one of a single layout gets none."""
    from cutetune.models.report import markdown, metrics_json

    _write_layouts(tmp_path / "two", ["kk", "kn"], n=16, configs=24)
    options = TrainOptions(folds=3, n_estimators=20, max_depth=4, objectives=("regression",),
                           baselines=False, family_out=False)
    _, ev = train(load_measurements(tmp_path / "two"), options)
    by = ev.by_layout[ev.chosen]
    assert list(by) == ["kk", "kn"] and by["kk"]["problems"] == by["kn"]["problems"] == 16
    metrics = metrics_json(ev, {})
    assert {t["what"] for t in metrics["targets"]} >= {"top1_geomean (kk)", "top1_p10 (kn)"}
    kn = next(t for t in metrics["targets"] if t["what"] == "top1_geomean (kn)")
    assert kn["value"] == by["kn"]["top1_geomean"] and kn["met"] == (kn["value"] >= 0.97)
    assert "### By layout" in markdown(ev, {}, [], "") and "kn (16)" in markdown(ev, {}, [], "")
    _write_layouts(tmp_path / "one", ["kk"], n=16, configs=24)
    _, one = train(load_measurements(tmp_path / "one"), options)
    assert one.by_layout == {} and "By layout" not in markdown(one, {}, [], "")


def test_another_dtypes_data_joins_every_fit_but_no_held_out_layer(tmp_path):
    """fp16 folds fit on the other fp16 folds plus the bf16 data, less every bf16 problem of a
    held-out layer in any layout (its sizes in any order); bf16 is never scored."""
    from cutetune.models.crossval import held_out_scores
    from cutetune.models.data import layer_key
    from cutetune.models.methods import Method

    _write_layouts(tmp_path / "fp16", ["kk"], dtype="fp16", seed=3)
    _write_layouts(tmp_path / "bf16", ["kk", "mn"], seed=3)  # the same layers, two layouts
    _write_layouts(tmp_path / "bf16", ["kn"], seed=4)  # and others
    data, extra = load_measurements(tmp_path / "fp16"), load_measurements(tmp_path / "bf16")
    assert {p.dtype for p in extra.problems} == {"bf16"}
    fits = []

    def fit(d, X):
        assert len(X) == len(d.time_ms) and (np.diff(d.group) >= 0).all()
        fits.append(d.problems)

    method = Method("zero", "", lambda d, X: np.zeros(len(X)), fit)
    splits = data.folds(3, 0)
    X = np.zeros((len(data.time_ms), 1))
    extra_X = np.zeros((len(extra.time_ms), 1))
    h = held_out_scores(data, X, method, splits, extra=(extra, extra_X))
    assert h.problems.eff[1].shape == (data.n_problems,)  # only fp16 problems are scored
    for (train_idx, test_idx), fitted in zip(splits, fits):
        held = {layer_key(data.problems[i]) for i in test_idx}
        bf16 = [p for p in fitted if p.dtype == "bf16"]
        assert {p for p in fitted if p.dtype == "fp16"} == {data.problems[i] for i in train_idx}
        assert not {layer_key(p) for p in bf16} & held
        assert len(bf16) == sum(layer_key(p) not in held for p in extra.problems)
        assert any(p.a_major == "m" for p in bf16)  # a layout the fp16 data lacks

    options = TrainOptions(folds=3, n_estimators=20, max_depth=4, objectives=("regression",),
                           baselines=False, family_out=False)
    model, ev = train(data, options, extra)
    assert ev.extra == {"problems": extra.n_problems, "rows": len(extra.time_ms),
                        "dtypes": ["bf16"]}
    assert model.dtype == "fp16" and model.metadata["trained_on"]["extra"] == ev.extra
    # the layouts its own dataset measured: the joined bf16 mn lends the ranker, not the
    # fallback, which fit on fp16 kk alone
    assert model.metadata["trained_on"]["layouts"] == ["kk"]
    mn = next(p for p in extra.problems if p.a_major == "m")
    mn = GemmProblem(mn.m, mn.n, mn.k, dtype="fp16", out_dtype="fp16", a_major="m", b_major="n")
    assert not model.measured_layout(mn) and model.measured_layout(data.problems[0])
    assert ev.problems == data.n_problems


def test_another_devices_data_cannot_join(tmp_path):
    _write_layouts(tmp_path / "fp16", ["kk"], dtype="fp16", seed=3)
    _write_layouts(tmp_path / "h100", ["kk"], seed=3, device="NVIDIA H100 80GB HBM3")
    data = load_measurements(tmp_path / "fp16")
    options = TrainOptions(folds=3, n_estimators=5, objectives=("regression",), baselines=False,
                           family_out=False)
    with pytest.raises(ValueError, match="H100.*cannot join those of NVIDIA H200"):
        train(data, options, load_measurements(tmp_path / "h100"))


def test_train_cli_also_records_and_reports_the_joined_data(tmp_path, capsys):
    _write_layouts(tmp_path / "fp16", ["kk"], dtype="fp16", seed=3)
    _write_layouts(tmp_path / "bf16", ["kk", "mn"], seed=3)
    out, report = tmp_path / "m.json", tmp_path / "r"
    rc = main(["train", str(tmp_path / "fp16"), "--also", str(tmp_path / "bf16"), "--out",
               str(out), "--report", str(report), "--folds", "3", "--trees", "10",
               "--objectives", "regression", "--no-baselines", "--no-family-out"])
    assert rc == 0
    extra = load_model(out, dtype="fp16").metadata["trained_on"]["extra"]
    assert extra["dataset"] == str(tmp_path / "bf16") and len(extra["sha256"]) == 64
    text = (report / "report.md").read_text()
    assert f"Joined every fit of the learned models, never scored: `{tmp_path / 'bf16'}`" in text
    assert main(["train", str(tmp_path / "fp16"), "--also", str(tmp_path / "nowhere"), "--out",
                 str(out), "--folds", "3", "--no-baselines"]) != 0
    assert "nowhere" in capsys.readouterr().err


def test_a_held_out_family_and_layer_leave_the_joined_data(tmp_path):
    """Leave-one-family-out drops the joined data's problems of that family too; a fit whose
    held-out layers cover all of the joined data fits on its own data alone; the same dtype
    cannot join (its problems would weigh double)."""
    from cutetune.models.data import with_extra

    _write_layouts(tmp_path / "fp16", ["kk"], dtype="fp16", seed=3)
    _write_layouts(tmp_path / "bf16", ["kk", "mn"], seed=5)
    data, extra = load_measurements(tmp_path / "fp16"), load_measurements(tmp_path / "bf16")
    X, extra_X = np.zeros((len(data.time_ms), 2)), np.ones((len(extra.time_ms), 2))
    assert set(extra.families) == {"random"}
    joined, joined_X = with_extra(data, X, (extra, extra_X), held_families={"llama3_8b"})
    assert joined.n_problems == data.n_problems + extra.n_problems
    assert len(joined_X) == len(joined.time_ms) and (joined_X[len(X):] == 1).all()
    alone, alone_X = with_extra(data, X, (extra, extra_X), held_families={"random"})
    assert alone is data and len(alone_X) == len(X)
    alone, _ = with_extra(data, X, (extra, extra_X), held_out=extra.problems)
    assert alone is data
    # held out by family, a fold's fits leave out the joined problems of its test families
    from cutetune.models.crossval import held_out_scores
    from cutetune.models.methods import Method

    fits = []
    method = Method("zero", "", lambda d, X: np.zeros(len(X)), lambda d, X: fits.append(d.problems))
    held_out_scores(data, X, method, data.folds(3, 0), extra=(extra, extra_X), family_out=True)
    assert len(fits) == 3 and all(p.dtype == "fp16" for f in fits for p in f)
    options = TrainOptions(folds=3, n_estimators=5, objectives=("regression",), baselines=False,
                           family_out=False)
    with pytest.raises(ValueError, match="another dtype; both hold fp16"):
        train(data, options, data)
