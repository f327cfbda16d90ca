"""The tuning loop, its strategies and the `cutetune tune` command, on SYNTHETIC replayed data
(see test_replay.py: nothing here is a GPU measurement)."""

from __future__ import annotations

import numpy as np
import optuna
import pytest

from cutetune.cli import main
from cutetune.models.dataset import append
from cutetune.space import GemmProblem, enumerate_configs, is_valid
from cutetune.tuner.search.backends import GpuBackend, ReplayBackend
from cutetune.tuner.search.samplers import (STRATEGIES, ModelGuidedSampler, RankedTimes,
    SpaceEncoding, make_sampler)
from cutetune.tuner.search.storage import open_storage
from cutetune.tuner.search.study import Budget, open_study, tune_study
from test_replay import ModelLikeScorer, synthetic_table

optuna.logging.set_verbosity(optuna.logging.WARNING)
PROBLEM = GemmProblem(256, 4096, 2048)


@pytest.fixture(scope="module")
def backend():
    return ReplayBackend(synthetic_table([PROBLEM]))


@pytest.fixture(scope="module")
def encoding():
    return SpaceEncoding(enumerate_configs(PROBLEM.arch, PROBLEM))


def _tune(strategy, backend, encoding, budget, storage=None, name=None, **kw):
    sampler = make_sampler(strategy, PROBLEM, encoding, seed=0, scorer=ModelLikeScorer(), **kw)
    study = open_study(PROBLEM, encoding, sampler, storage, name) if storage else \
        optuna.create_study(sampler=sampler)
    return sampler, study, tune_study(study, sampler, PROBLEM, encoding, backend, budget)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_strategies_propose_only_valid_configs(strategy, backend, encoding):
    _, study, result = _tune(strategy, backend.fresh(), encoding, Budget(trials=40))
    assert result.steps
    for step in result.steps:
        assert is_valid(step.config, PROBLEM.arch, PROBLEM), step.config
    # each trial's parameters decode to the config that was measured for it
    for t, step in zip(study.trials, result.steps):
        assert encoding.decode(t.params) == step.config
        assert t.user_attrs["config_key"] == step.config.short()


def test_decoder_repairs_any_grid_point(encoding):
    rng = np.random.default_rng(0)
    for _ in range(500):
        params = {a: int(rng.integers(len(v))) for a, v in encoding.axes.items()}
        c = encoding.decode(params)
        assert is_valid(c, PROBLEM.arch, PROBLEM)
    for c in encoding.candidates[::97]:  # a valid point decodes to itself
        assert encoding.decode(encoding.encode(c)) == c


def test_study_resumes_from_storage(backend, encoding, tmp_path):
    storage = open_storage(f"journal:{tmp_path / 'studies.journal'}")
    _, _, first = _tune("model", backend.fresh(), encoding, Budget(trials=4), storage, "s")
    # a new process: new sampler and backend, same storage and study name
    storage = open_storage(f"journal:{tmp_path / 'studies.journal'}")
    _, study, second = _tune("model", backend.fresh(), encoding, Budget(trials=4), storage, "s")
    assert len(first.steps) == 4 and second.steps  # (the model may stop itself before 4)
    assert len(study.trials) == len(first.steps) + len(second.steps)
    first_keys = {s.config.short() for s in first.steps}
    assert len(second.earlier) == sum(s.status == "ok" for s in first.steps)
    assert not first_keys & {s.config.short() for s in second.steps if not s.reused}
    # what resumed continues the search: its best is at least as good
    assert second.best()[1] <= first.best()[1]


def test_resume_refuses_another_space(backend, encoding, tmp_path):
    storage = open_storage(f"journal:{tmp_path / 'studies.journal'}")
    _tune("random", backend.fresh(), encoding, Budget(trials=2), storage, "s")
    other = SpaceEncoding(encoding.candidates[:100])
    with pytest.raises(ValueError, match="different set of configs"):
        open_study(PROBLEM, other, optuna.samplers.RandomSampler(), storage, "s")


class CountingBackend:
    """Wraps a replay backend and records every config it is asked to measure."""

    def __init__(self, inner):
        self.inner, self.measured = inner, []

    def measure(self, problem, configs):
        self.measured += configs
        return self.inner.measure(problem, configs)


class SplitKBlindScorer(ModelLikeScorer):
    """The model-like scorer, except that it calls every split-K config 3x slower."""

    def predict_log_time(self, problem, configs):
        sk = np.array([c.split_k > 1 for c in configs])
        return super().predict_log_time(problem, configs) + np.log(3.0) * sk


def test_model_sampler_prunes_before_compiling(backend, encoding):
    counting = CountingBackend(backend.fresh())
    sampler = ModelGuidedSampler(encoding, PROBLEM, SplitKBlindScorer())
    study = optuna.create_study(sampler=sampler)
    result = tune_study(study, sampler, PROBLEM, encoding, counting, Budget(kernels=200))
    assert result.stop_reason == sampler.stop_reason != ""  # it stopped itself
    kernels = {c.compile_key() for c in counting.measured}
    charged = sum(s.compile_s > 0 for s in result.steps)
    assert charged == len(kernels) == result.kernels  # one build per compile key
    n_space = len({c.compile_key() for c in encoding.candidates})
    assert len(kernels) <= n_space // 20  # the rest were pruned without being built
    # split-K configs, predicted 3x slower, are never built
    split_k = [c for c in encoding.candidates if c.split_k > 1]
    assert split_k and not any(c.split_k > 1 for c in counting.measured)


def test_gpu_backend_adapts_harness_rows():
    cfgs = enumerate_configs(PROBLEM.arch, PROBLEM)[:2]

    def harness(problem, configs):
        assert problem == PROBLEM and configs == cfgs
        return [{"backend": "quack", "config_key": cfgs[1].short(), "status": "runtime_error",
                 "compile_s": 2.0},
                {"backend": "quack", "config_key": cfgs[0].short(), "status": "ok",
                 "time_ms": 0.5, "compile_s": 3.0}]

    m = GpuBackend(harness).measure(PROBLEM, cfgs)
    assert [x.config for x in m] == cfgs
    assert (m[0].status, m[0].time_ms, m[0].compile_s) == ("ok", 0.5, 3.0)
    assert (m[1].status, m[1].time_ms, m[1].compile_s) == ("runtime_error", None, 2.0)
    assert m[0].row["config_key"] == cfgs[0].short()
    with pytest.raises(RuntimeError, match="no row for"):
        GpuBackend(lambda p, c: []).measure(PROBLEM, cfgs)


def _cli(tmp_path, *extra):
    dims = ["--m", str(PROBLEM.m), "--n", str(PROBLEM.n), "--k", str(PROBLEM.k)]
    return main(["tune", *dims, "--backend", f"replay:{tmp_path / 'ds'}",
                 "--storage", f"journal:{tmp_path / 'j.journal'}", *extra])


def test_cli_tunes_and_resumes(tmp_path, capsys):
    append(tmp_path / "ds", synthetic_table([PROBLEM]).to_pylist())
    assert _cli(tmp_path, "--strategy", "random", "--trials", "6") == 0
    out = capsys.readouterr().out
    assert "trial budget (6) spent" in out and "best" in out
    assert _cli(tmp_path, "--strategy", "random", "--trials", "3") == 0
    out = capsys.readouterr().out
    assert "ok configs from earlier runs" in out
    assert _cli(tmp_path, "--strategy", "quack44") == 0
    assert "listed configs" in capsys.readouterr().out


def test_cli_gpu_path_reports_cublas_and_appends(tmp_path, capsys, monkeypatch):
    """The GPU path with the harness replaced by recorded rows (no GPU here): the run ends with
    a cuBLAS measurement, appends every row to the dataset and writes a --results line."""
    import json

    from cutetune.models.dataset import load
    from cutetune.tuner.measure import gpu_session, timing

    monkeypatch.setattr(timing, "require_gpu", lambda: 1)  # the GPU check passes
    table = synthetic_table([PROBLEM])
    rows = {r["config_key"]: r for r in table.to_pylist()}
    monkeypatch.setattr(gpu_session, "measure_configs",
                        lambda problem, configs: [rows[c.short()] for c in configs])
    cublas = {**next(iter(rows.values())), "backend": "cublas", "config_key": "",
              "status": "ok", "time_ms": 0.25}
    monkeypatch.setattr(gpu_session, "measure_cublas", lambda problem: cublas)
    dims = ["--m", str(PROBLEM.m), "--n", str(PROBLEM.n), "--k", str(PROBLEM.k)]
    assert main(["tune", *dims, "--strategy", "random", "--trials", "5",
                 "--storage", f"journal:{tmp_path / 'j.journal'}",
                 "--dataset", str(tmp_path / "out"), "--results", str(tmp_path / "r.jsonl")]) == 0
    assert "cuBLAS    0.2500 ms" in capsys.readouterr().out
    (record,) = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert record["cublas_ms"] == 0.25 and record["measured"] == 5
    assert record["best_ms"] == min(t for t in record["times_ms_in_order"] if t is not None)
    assert record["speedup_vs_cublas"] == pytest.approx(0.25 / record["best_ms"])
    appended = load(tmp_path / "out").column("backend").to_pylist()
    assert sorted(appended) == ["cublas"] + ["quack"] * 5


@pytest.mark.gpu
def test_gpu_cli_tunes_on_the_gpu(tmp_path, capsys):
    """The real GPU path (run through the device tool): the model strategy's trials compile in
    the GPU executor's 2-worker pool and are timed on the GPU, cuBLAS is measured last, and
    every row lands in the dataset with the results line."""
    import json

    from cutetune.models.dataset import load
    from cutetune.tuner.measure.gpu_session import COMPILE_WORKERS

    assert COMPILE_WORKERS == 2
    assert main(["tune", "--m", "2048", "--n", "2048", "--k", "2048", "--trials", "6",
                 "--storage", f"journal:{tmp_path / 'j.journal'}",
                 "--dataset", str(tmp_path / "out"), "--results", str(tmp_path / "r.jsonl")]) == 0
    (record,) = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    times = [t for t in record["times_ms_in_order"] if t is not None]
    assert record["measured"] >= 1 and times and record["best_ms"] == min(times) > 0
    assert record["cublas_ms"] > 0 and 0.2 < record["speedup_vs_cublas"] < 5
    rows = load(tmp_path / "out").to_pylist()
    assert sum(r["backend"] == "cublas" for r in rows) == 1
    assert sum(r["backend"] == "quack" and r["status"] == "ok" for r in rows) == len(times)
    print(capsys.readouterr().out)


def test_cli_user_errors_are_one_line(tmp_path, capsys):
    append(tmp_path / "ds", synthetic_table([PROBLEM]).to_pylist())
    assert _cli(tmp_path, "--strategy", "random", "--margin", "0.1") == 2
    assert "apply to --strategy model only" in capsys.readouterr().err
    assert main(["tune", "--m", "64", "--n", "64", "--k", "64", "--backend", "tpu"]) == 2
    assert "--backend must be" in capsys.readouterr().err
    assert main(["tune", "--m", "64", "--n", "64", "--k", "64",
                 "--backend", f"replay:{tmp_path / 'ds'}"]) == 2
    assert "no measurements of sm90:bf16->bf16:kk:b1:m64:n64:k64" in capsys.readouterr().err


def test_model_sampler_corrects_the_model_online(backend, encoding):
    """A model that is 2x off in level and 26% too fast on every swap_ab config: a few
    measurements fix the level, and the swap configs near a measured one are corrected more
    than those far from it."""
    truth = np.log([backend.recorded(PROBLEM, c).time_ms or np.nan for c in encoding.candidates])
    ok = np.isfinite(truth)

    class Miscalibrated(ModelLikeScorer):
        def predict_log_time(self, problem, configs):
            swap = np.array([c.swap_ab for c in configs])
            return super().predict_log_time(problem, configs) + np.log(2.0) - 0.3 * swap

    sampler = ModelGuidedSampler(encoding, PROBLEM, Miscalibrated())
    swap = np.array([c.swap_ab for c in encoding.candidates])
    rng = np.random.default_rng(0)
    idx = rng.choice(np.flatnonzero(ok & ~swap), 4, replace=False)
    idx = np.r_[idx, rng.choice(np.flatnonzero(ok & swap), 1)]
    mu, sd = sampler.posterior(idx, truth[idx])
    assert np.allclose(mu[idx], truth[idx], atol=0.03) and np.all(sd[idx] < 0.05)
    err_prior, err_post = np.abs(sampler.prior - truth), np.abs(mu - truth)
    assert np.median(err_prior[ok & ~swap]) > 0.6 and np.median(err_post[ok & ~swap]) < 0.1
    rho = sampler._rho(np.arange(len(mu)), idx[-1:])[:, 0]  # correlation to the swap member
    near, far = ok & swap & (rho > 0.5), ok & swap & (rho < 0.1)
    assert near.sum() >= 10 and far.sum() >= 10
    assert np.median(err_post[near]) < 0.6 * np.median(err_post[far])


def test_ranked_times_uses_the_ranker_order_on_the_timer_scale(encoding):
    """RankedTimes gives the k-th config of the ranker's order the k-th smallest time."""
    configs = list(encoding.candidates[:5])

    class TwoHeaded:  # rank(): the ranker's order, each config with the time model's ms
        def rank(self, problem, cs):
            assert problem == PROBLEM and cs == configs
            return [(cs[3], 4.0), (cs[0], 1.0), (cs[4], 2.0), (cs[1], 8.0), (cs[2], 3.0)]

    got = RankedTimes(TwoHeaded()).predict_log_time(PROBLEM, configs)
    assert np.allclose(np.exp(got), [2.0, 4.0, 8.0, 1.0, 3.0])


def test_the_gpu_backend_is_guided_by_the_model_shipped_for_the_gpu_that_measures(monkeypatch):
    """tune --backend gpu without --model: on an H100 the H100's shipped model guides the
    search (configs rank differently there), on other GPUs and in a replay the arch's."""
    from argparse import Namespace

    from cutetune.commands import tune
    from cutetune.tuner.kernels import problems

    def scorer_device(gpu: str, backend: str = "gpu") -> str:
        monkeypatch.setattr(problems, "cuda_device_name", lambda: gpu)
        return tune._scorer(Namespace(model=None, backend=backend), PROBLEM).model.device.name

    assert scorer_device("NVIDIA H100 80GB HBM3") == "H100_SXM"
    assert scorer_device("NVIDIA H200") == scorer_device("NVIDIA H100 80GB HBM3", "replay:x") \
        == "H200"
