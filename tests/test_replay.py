"""Replay backend and replay benchmark, on SYNTHETIC data generated here (no GPU timings).

The synthetic timing law below is a crude roofline with hidden per-family effects and noise;
it exists only to exercise the code paths and give the strategies something with structure
to find. Nothing here is a measured number.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pyarrow as pa
import pytest

from cutetune.models.dataset import SCHEMA, SCHEMA_VERSION, append, load
from cutetune.space import GemmProblem, KernelConfig, enumerate_configs
from cutetune.tuner.search.backends import BENCH_OVERHEAD_S, ReplayBackend, ReplayError
from cutetune.tuner.search.replay import (exhaustive_problems, replay, replay_one, summarize,
    write_report)
from cutetune.tuner.search.study import Budget

PEAK_FLOPS, BANDWIDTH, SMS = 790e12, 4.3e12, 132


def roofline_log_time(problem: GemmProblem, configs) -> np.ndarray:
    """ln(ms) of a crude roofline: whole waves of padded tiles vs. tile traffic."""
    p = problem
    out = np.empty(len(configs))
    for i, c in enumerate(configs):
        km, kn = (p.n, p.m) if c.swap_ab else (p.m, p.n)
        tm = math.ceil(math.ceil(km / c.tile_m) / c.cluster_m) * c.cluster_m
        tn = math.ceil(math.ceil(kn / c.tile_n) / c.cluster_n) * c.cluster_n
        ctas = tm * tn * p.batch * c.split_k
        waves = math.ceil(ctas / c.cluster_size / (SMS // c.cluster_size))
        k_split = math.ceil(p.k / c.split_k)
        t_compute = waves * 2 * c.tile_m * c.tile_n * k_split * SMS / PEAK_FLOPS
        tiles_read = km * tn / c.cluster_n + kn * tm / c.cluster_m
        traffic = 2 * p.batch * k_split * c.split_k * tiles_read
        t_mem = (traffic + 2 * p.m * p.n * (1 + 4 * (c.split_k - 1))) / BANDWIDTH
        out[i] = math.log(1e3 * (max(t_compute, t_mem) + 4e-6))
    return out


def family_effect(problem: GemmProblem, configs, sigma: float, salt: str) -> np.ndarray:
    """A fixed pseudo-random log-time offset per (problem, tile shape, mode, cluster, split-K)
    family: what a roofline cannot see."""
    out = np.empty(len(configs))
    for i, c in enumerate(configs):
        fam = (f"{salt}|{problem.key()}|{c.tile_m}|{c.tile_n}|{c.pingpong}|{c.cluster_size}|"
               f"{c.split_k}")
        out[i] = sigma * np.random.default_rng(zlib.crc32(fam.encode())).standard_normal()
    return out


def synthetic_log_time(problem: GemmProblem, configs) -> np.ndarray:
    """The synthetic "truth" before run-to-run noise: roofline, family effects, and a 2%
    penalty for swizzle 1."""
    swz = np.array([c.max_swizzle_size == 1 for c in configs])
    return (roofline_log_time(problem, configs) + family_effect(problem, configs, 0.06, "truth")
            + 0.02 * swz)


class ModelLikeScorer:
    """An informative, imperfect cost model of the synthetic truth: it sees the roofline and
    the family effects, with its own family-correlated error of ``sigma`` (log time), and is
    blind to the swizzle penalty and the noise."""

    def __init__(self, sigma: float = 0.03):
        self.sigma = sigma

    def predict_log_time(self, problem, configs):
        return (roofline_log_time(problem, configs) + family_effect(problem, configs, 0.06, "truth")
                + family_effect(problem, configs, self.sigma, "model error"))


class ConstantScorer:
    def predict_log_time(self, problem, configs):
        return np.zeros(len(configs))


def synthetic_rows(problems, seed: int = 0, fail_every: int = 97) -> list[dict]:
    """One row per valid config of each problem; every ``fail_every``-th config fails."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in problems:
        configs = enumerate_configs(p.arch, p)
        log_t = synthetic_log_time(p, configs)
        for i, c in enumerate(configs):
            t = math.exp(log_t[i] + rng.normal(0, 0.01))
            failed = i % fail_every == fail_every - 1
            rows.append({
                **p.to_dict(), **c.to_dict(), "problem_key": p.key(), "config_key": c.short(),
                "suite": "synthetic_exhaustive", "backend": "quack", "device_name": "synthetic",
                "run_id": "synthetic", "timestamp": 1.0 + i,
                "status": "runtime_error" if failed else "ok",
                "time_ms": None if failed else t, "n_reps": 20,
                # builds cost 5-15 s; only the first of a compile key's rows records it
                "compile_s": 0.0 if c.max_swizzle_size == 8 else 5.0 + 10.0 * rng.random(),
            })
    return rows


def synthetic_table(problems, seed: int = 0) -> pa.Table:
    rows = [{**{f.name: None for f in SCHEMA}, "schema_version": SCHEMA_VERSION, **r}
            for r in synthetic_rows(problems, seed)]
    return pa.Table.from_pylist(rows, schema=SCHEMA)


PROBLEMS = [GemmProblem(4096, 4096, 4096), GemmProblem(64, 8192, 4096),
            GemmProblem(1024, 2048, 8192)]


@pytest.fixture(scope="module")
def table():
    return synthetic_table(PROBLEMS)


def test_replay_backend_answers_recorded_numbers(table, tmp_path):
    append(tmp_path / "ds", table.to_pylist())  # also through a dataset folder
    table = load(tmp_path / "ds")  # the numbers as recorded (stored times are float32)
    rows = {(r["problem_key"], r["config_key"]): r for r in table.to_pylist()}
    cold = {}  # a kernel is shape-independent: its cold build is the max over all problems
    for r in rows.values():
        fields = KernelConfig.__dataclass_fields__
        k = KernelConfig.from_dict({f: r[f] for f in fields}).compile_key()
        cold[k] = max(cold.get(k, 0.0), r["compile_s"])
    for backend in (ReplayBackend(table), ReplayBackend(tmp_path / "ds")):
        p = PROBLEMS[1]
        configs = enumerate_configs(p.arch, p)[:300]
        got = backend.measure(p, configs)
        charged = set()
        for m in got:
            r = rows[(p.key(), m.config.short())]
            assert m.status == r["status"] and m.time_ms == r["time_ms"]
            assert m.bench_s == pytest.approx(BENCH_OVERHEAD_S + (r["time_ms"] or 0) * 20 / 1e3)
            if m.config.compile_key() in charged:
                assert m.compile_s == 0.0
            else:  # the cold build: the compile key's largest recorded compile_s
                assert m.compile_s == cold[m.config.compile_key()] > 0
                charged.add(m.config.compile_key())
        # a fresh run pays again; the same run does not
        assert backend.measure(p, configs[:1])[0].compile_s == 0.0
        assert backend.fresh().measure(p, configs[:1])[0].compile_s > 0.0


def test_replay_backend_refuses_unrecorded(table):
    backend = ReplayBackend(table)
    with pytest.raises(ReplayError, match="not recorded"):
        backend.measure(GemmProblem(512, 512, 512), [KernelConfig()])
    with pytest.raises(ReplayError, match="config 128x224co"):
        backend.measure(PROBLEMS[0], [KernelConfig(128, 224, False, 2, 1)])


def test_exhaustive_problems_need_full_coverage(table):
    partial = table.slice(0, table.num_rows - 5)  # the last problem loses 5 configs
    assert [p.key() for p in exhaustive_problems(ReplayBackend(partial))] == \
        [p.key() for p in PROBLEMS[:2]]


def test_small_replay_model_beats_random(table, tmp_path):
    backend = ReplayBackend(table)
    scorers = {p.key(): ModelLikeScorer() for p in PROBLEMS}
    budgets = {"random": Budget(kernels=24), "tpe": Budget(kernels=24), "model": Budget(kernels=64)}
    runs = replay(backend, PROBLEMS, ["model", "random", "tpe", "quack44"], seeds=[0, 1],
                  budgets=budgets, scorers=scorers)
    assert {r.strategy for r in runs} == {"model", "random", "tpe", "quack44"}
    assert sum(r.strategy == "random" for r in runs) == 6  # 3 problems x 2 seeds
    s = summarize(runs)
    # floors, on this synthetic data: the guided search reaches 0.99 of the oracle within a
    # handful of kernels and stops far short of exhaustive cost; random does not in 24
    assert s["model"]["median_kernels_to_target"] <= 6
    assert s["model"]["median_speedup_vs_exhaustive"] >= 10
    assert s["model"]["final_efficiency_geomean"] > s["random"]["final_efficiency_geomean"]
    assert s["random"]["median_kernels_to_target"] > s["model"]["median_kernels_to_target"]
    for r in runs:  # traces are monotone and costs add up
        assert np.all(np.diff(r.best_ms) <= 0) and np.all(np.diff(r.cost_s) >= 0)
        assert r.oracle_ms <= min(r.best_ms)
    files = write_report(runs, {"all": s}, {"title": "synthetic", "facts": {}, "method": []},
                         tmp_path / "replay")
    assert all(f.stat().st_size > 0 for f in files)


def test_uninformative_model_does_not_pass_the_floor(table):
    """The floor above is not automatic: a constant scorer gives the guided search nothing."""
    run = replay_one(ReplayBackend(table), PROBLEMS[0], "model", 0, Budget(kernels=64),
                     scorer=ConstantScorer())
    assert run.kernels_to() > 6
