"""Scheduling, failure isolation and resume of `collect`, with the hardware edges swapped for
CPU stand-ins (the GPU path itself is covered by tests/test_gpu_harness.py on the H200).
The stand-in rows are labelled by a 'synthetic' device name and never leave the tmp dir."""

import math
import os

import numpy as np
import pytest

from cutetune.models import dataset
from cutetune.space import GemmProblem, KernelConfig
from cutetune.tuner.measure.collect import collect
from cutetune.tuner.measure.workers import IsolatedPool

CRASH_TILE_N = 48
HANG_TILE_N = 96
COMPILE_FAIL_TILE_N = 32


def fake_compile(task):
    problem, config = task
    if config.tile_n == COMPILE_FAIL_TILE_N:
        raise RuntimeError("stand-in compiler rejects this config")
    return 0.01


def fake_init(cache_dir):
    pass


def fake_measure(task):
    rows = []
    if task.cublas:
        rows.append(_row(task, None))
    for c in task.configs:
        if c.tile_n == CRASH_TILE_N:
            os.abort()
        if c.tile_n == HANG_TILE_N:
            import time

            time.sleep(60)
        rows.append(_row(task, c))
    return rows


def _row(task, c):
    p = task.problem
    return {**p.to_dict(), **(c.to_dict() if c else {}), "problem_key": p.key(),
            "suite": task.suite, "backend": "quack" if c else "cublas",
            "config_key": c.short() if c else "", "status": "ok", "time_ms": 1.0,
            "device_name": "synthetic-test-stand-in"}


def _configs():
    return [KernelConfig(tile_m=128, tile_n=n, pingpong=True, cluster_m=1, cluster_n=1)
            for n in (16, 32, 48, 64, 96, 128)]


def test_collect_isolates_failures_and_resumes(tmp_path, monkeypatch):
    import json

    import cutetune.tuner.measure.timing as measure_mod

    cfg_file = tmp_path / "configs.json"
    cfg_file.write_text(json.dumps([c.to_dict() for c in _configs()]))
    problems = [("t", GemmProblem(256, 512, 1024)), ("t", GemmProblem(64, 1024, 512))]
    out = tmp_path / "ds"
    # the hang is cut short by a small per-task timeout
    monkeypatch.setattr("cutetune.tuner.measure.executor.IsolatedPool",
                        _with_timeout(IsolatedPool, 8.0))
    stats = collect(problems, str(cfg_file), str(out), compile_workers=2,
                    cache_dir=str(tmp_path / "cache"), measure_fn=fake_measure,
                    gpu_init=fake_init, compile_fn=fake_compile,
                    policy=measure_mod.TimingPolicy())
    t = dataset.load(out).to_pylist()
    keys = [(r["problem_key"], r["backend"], r["config_key"]) for r in t]
    assert len(keys) == len(set(keys)) == 2 * (len(_configs()) + 1)
    status = {(r["problem_key"], r["tile_n"]): r["status"] for r in t if r["backend"] == "quack"}
    for p in problems:
        assert status[(p[1].key(), CRASH_TILE_N)] == "crash"
        assert status[(p[1].key(), HANG_TILE_N)] == "timeout"
        assert status[(p[1].key(), COMPILE_FAIL_TILE_N)] == "compile_error"
        assert status[(p[1].key(), 128)] == "ok"
    assert stats["by_status"]["ok"] == 2 * 4  # 3 good configs + cuBLAS per problem
    # Resume: nothing left to do, nothing measured twice.
    again = collect(problems, str(cfg_file), str(out), compile_workers=1,
                    cache_dir=str(tmp_path / "cache"), measure_fn=fake_measure,
                    gpu_init=fake_init, compile_fn=fake_compile)
    assert again["measured"] == 0
    assert len(dataset.load(out)) == len(t)


def plain_compile(task):
    return 0.01


def plain_measure(task):
    return [_row(task, None)] * task.cublas + [_row(task, c) for c in task.configs]


def test_a_sampled_problem_is_done_at_its_count_whichever_configs_it_has(tmp_path):
    """'sample:N' resumes by count: a problem holding N configs (another spec's sample, a
    pool's) asks for none; one holding fewer gets the rest of its own sample."""
    problems = [("t", GemmProblem(256, 512, 1024)), ("t", GemmProblem(512, 1024, 256))]
    out = str(tmp_path / "ds")

    def run(spec):
        return collect(problems, spec, out, compile_workers=1, cache_dir=str(tmp_path / "c"),
                       measure_fn=plain_measure, gpu_init=fake_init, compile_fn=plain_compile)

    assert run("sample:2@5")["measured"] == 2 * 3  # and cuBLAS
    assert run("sample:4")["measured"] == 2 * 2  # the 2 it lacks, of its own sample
    assert run("sample:4@3")["measured"] == 0
    assert run("sample:6")["measured"] == 2 * 2
    rows = dataset.load(out).to_pylist()
    assert len({(r["problem_key"], r["config_key"]) for r in rows if r["backend"] == "quack"}) \
        == 2 * 6


def other_gpu_measure(task):
    return [{**r, "device_name": "another GPU"} for r in plain_measure(task)]


def test_collect_refuses_another_gpus_rows_and_keeps_the_dataset(tmp_path):
    """A dataset is one device's: rows of another GPU are refused before they are appended."""
    out = str(tmp_path / "ds")

    def run(problem, measure):
        return collect([("t", problem)], "sample:2", out, compile_workers=1,
                       cache_dir=str(tmp_path / "c"), measure_fn=measure, gpu_init=fake_init,
                       compile_fn=plain_compile)

    run(GemmProblem(256, 512, 1024), plain_measure)
    before = dataset.load(out).to_pylist()

    with pytest.raises(ValueError, match="holds measurements of synthetic-test-stand-in, and "
                                         "these are of another GPU"):
        run(GemmProblem(512, 1024, 256), other_gpu_measure)
    assert dataset.load(out).to_pylist() == before
    assert run(GemmProblem(512, 1024, 256), plain_measure)["measured"] == 3


def test_a_pooled_sample_draws_from_its_classes_pool():
    """'sample:N@K': N valid configs per problem from K compile keys shared by the problems of
    a kernel class (dtype, majors), topped up from the rest where the pool has too few."""
    from cutetune.space.rules import family_of, is_valid
    from cutetune.tuner.kernels.compile import kernel_class
    from cutetune.tuner.measure.collect import config_pool, configs_for

    up, down = GemmProblem(4096, 14336, 4096), GemmProblem(4096, 4096, 14336)
    keys = {c.compile_key() for p in (up, down) for c in configs_for(p, "sample:20@10", 0)}
    assert len(keys) <= 10
    assert configs_for(up, "sample:20@10", 0) == configs_for(up, "sample:20@10", 0)
    assert configs_for(up, "sample:20@10", 0) != configs_for(up, "sample:20@10", 1)
    kk = kernel_class(up)
    assert config_pool(kk, family_of(up), 10, 0) != config_pool(kk, family_of(up), 10, 1)
    topped = configs_for(up, "sample:30@10", 0)  # 10 keys hold at most 20 configs (swizzles)
    assert len(set(topped)) == 30 and len({c.compile_key() for c in topped}) > 10
    assert all(is_valid(c, "sm90", up) for c in topped)
    grad = GemmProblem(4096, 14336, 4096, a_major="m", b_major="n")  # its own class and pool
    pools = [config_pool(kernel_class(p), family_of(p), 300, 0)
             for p in (up, grad)]
    assert len(pools[0]) == len(pools[1]) == 300 and pools[0] != pools[1]


def _with_timeout(cls, timeout_s):
    def make(fn, n, **kw):
        kw["timeout_s"] = min(kw.get("timeout_s", timeout_s), timeout_s)
        return cls(fn, n, **kw)

    return make


def test_dataset_append_is_atomic_and_checked(tmp_path):
    out = tmp_path / "ds"
    p = GemmProblem(128, 256, 512)
    dataset.append(out, [{**p.to_dict(), "problem_key": p.key(), "backend": "cublas",
                          "config_key": "", "status": "ok", "time_ms": 0.5}])
    assert not list(out.glob(".*.tmp"))
    assert dataset.done_keys(out) == {dataset.measurement_key(p.key(), "cublas")}
    (out / "part-999999-bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(dataset.DatasetError, match="corrupt dataset part"):
        dataset.load(out)
    with pytest.raises(dataset.DatasetError, match="no dataset parts"):
        dataset.load(tmp_path / "empty")


def test_a_damaged_byte_in_a_part_is_refused_not_read_as_another_time(tmp_path):
    """Every byte of an appended part, flipped in turn, is refused as corrupt, naming the
    part (its name holds its digest); compacting a compacted dataset keeps it."""
    out = tmp_path / "ds"
    rows = [{**GemmProblem(128, 256 + 64 * i, 512).to_dict(), "problem_key": f"p{i}",
             "backend": "cublas", "config_key": "", "status": "ok", "time_ms": 0.5 + i / 7}
            for i in range(40)]
    part = dataset.append(out, rows)
    written, raw = dataset.load(out), part.read_bytes()
    for i in range(0, len(raw), 7):
        part.write_bytes(raw[:i] + bytes([raw[i] ^ 0x10]) + raw[i + 1:])
        with pytest.raises(dataset.DatasetError, match=f"corrupt dataset part .*{part.name}"):
            dataset.load(out)
    part.write_bytes(raw)
    once = dataset.compact(out)
    assert dataset.compact(out) == once and dataset.load(out).equals(written)


def test_tuner_gpu_session_reuses_its_workers(tmp_path, monkeypatch):
    """measure_configs keeps one executor: the second call compiles nothing again."""
    from cutetune.tuner.measure import gpu_session
    from cutetune.tuner.measure.executor import GpuExecutor
    from cutetune.tuner.measure.timing import TimingPolicy

    compiled = []
    ex = GpuExecutor("sm90", str(tmp_path / "cache"), 1, TimingPolicy(), measure_fn=fake_measure,
                     gpu_init=fake_init, compile_fn=fake_compile)
    monkeypatch.setitem(gpu_session._executors, "sm90", ex)
    try:
        p = GemmProblem(256, 512, 1024)
        first = gpu_session.measure_configs(p, _configs()[:2])
        compiled.append(len(ex.kernel_ids))
        again = gpu_session.measure_configs(p, _configs()[:2] + [_configs()[3]])
        compiled.append(len(ex.kernel_ids))
    finally:
        ex.close()
    status = {r["tile_n"]: r["status"] for r in first}
    assert status == {16: "ok", COMPILE_FAIL_TILE_N: "compile_error"}
    assert {r["config_key"] for r in again} == {c.short() for c in _configs()[:2] + [_configs()[3]]}
    assert compiled == [2, 3]


COMMITTED = os.path.join(os.path.dirname(__file__), "..", "data")


@pytest.mark.skipif(not os.path.isdir(os.path.join(COMMITTED, "inputs", "h200_bf16")),
                    reason="no measured dataset in this checkout")
def test_committed_h200_datasets_load_with_the_schema_and_coverage():
    """The measured datasets under data/ read with this cutetune's schema, carry the
    provenance columns, and hold what the dataset report claims: >= 300 problems with >= 150
    configs, >= 40 swept exhaustively, a cuBLAS row for every problem."""
    from collections import Counter

    from cutetune.space import enumerate_configs

    for name in ("inputs/h200_bf16", "bench/h200_bf16_repeat", "bench/h200_bf16_tune"):
        table = dataset.load(os.path.join(COMMITTED, name))
        assert table.schema.names == dataset.SCHEMA.names, name
        # measured under schema version 1, compacted as the current version (grouped columns null)
        assert set(table.column("schema_version").to_pylist()) == {dataset.SCHEMA_VERSION}
        for col in ("device_name", "sm_count", "driver", "cuda", "torch_version",
                    "cutlass_dsl_version", "quack_version", "timestamp"):
            assert table.column(col).null_count == 0, (name, col)
    table = dataset.load(os.path.join(COMMITTED, "inputs", "h200_bf16"),
                         columns=list(dataset.PROBLEM_COLUMNS) + ["problem_key", "backend",
                                                                  "config_key", "status"])
    rows = table.to_pylist()
    quack = Counter(r["problem_key"] for r in rows if r["backend"] == "quack")
    cublas = {r["problem_key"] for r in rows if r["backend"] == "cublas" and r["status"] == "ok"}
    problems = {r["problem_key"]: dataset.problem_of(r) for r in rows}
    assert sum(n >= 150 for n in quack.values()) >= 300
    swept = [k for k, n in quack.items() if n >= 1000
             and n == len(enumerate_configs(problems[k].arch, problems[k]))]
    assert len(swept) >= 40
    assert set(quack) <= cublas


def test_launch_host_us_is_the_host_time_of_one_mm_launch():
    from cutetune.tuner.measure.timing import launch_host_us

    us = launch_host_us(device="cpu", calls=20, rounds=3)
    assert 0.0 < us < 1e5  # a 16x16 mm: microseconds, not zero, not a stalled run


def test_kernel_cache_follows_cutetunes_cache_folder(tmp_path, monkeypatch):
    """The tuner's quack kernel cache: an explicit folder, else $QUACK_CACHE_DIR, else
    ``quack-kernels`` in cutetune's cache folder ($CUTETUNE_CACHE)."""
    from cutetune.errors import OutputError
    from cutetune.settings import kernel_cache_dir

    monkeypatch.delenv("QUACK_CACHE_DIR", raising=False)
    monkeypatch.setenv("CUTETUNE_CACHE", str(tmp_path / "ct"))
    assert kernel_cache_dir() == str(tmp_path / "ct" / "quack-kernels")
    assert (tmp_path / "ct" / "quack-kernels").is_dir()
    monkeypatch.setenv("QUACK_CACHE_DIR", str(tmp_path / "q"))
    assert kernel_cache_dir() == str(tmp_path / "q")
    assert kernel_cache_dir(str(tmp_path / "x")) == str(tmp_path / "x")
    (tmp_path / "file").write_text("x")  # a cache that cannot be a folder is named
    monkeypatch.setenv("QUACK_CACHE_DIR", str(tmp_path / "file"))
    with pytest.raises(OutputError, match=f"kernel cache folder {tmp_path / 'file'} cannot"):
        kernel_cache_dir()


def grouped_fake_measure(task):
    import json

    assert task.counts is not None and sum(task.counts) == task.problem.m
    rows = [{**_row(task, c), "expert_counts": json.dumps(list(task.counts))}
            for c in task.configs]
    if task.cublas:
        rows.append({**_row(task, None), "backend": "aten",
                     "expert_counts": json.dumps(list(task.counts))})
    return rows


def test_collect_measures_grouped_problems_with_their_routing_and_resumes(tmp_path):
    """A grouped problem is measured on a seeded split of its rows among its experts, with
    torch._grouped_mm as its ATen row; the rows read back as that problem, and a rerun with
    more configs measures only the new ones."""
    import json

    from cutetune.space.enumerate import enumerate_configs
    from cutetune.space.problem import GroupedProblem
    from cutetune.tuner.measure.collect import routed_counts

    problems = [("t", GroupedProblem(8, 1000, 1024, 2048)),
                ("t", GroupedProblem(128, 64, 512, 2048))]
    configs = enumerate_configs("sm90", problems[0][1])
    out = tmp_path / "ds"
    kw = dict(compile_workers=1, cache_dir=str(tmp_path / "cache"), gpu_init=fake_init,
              compile_fn=fake_compile, measure_fn=grouped_fake_measure)
    for n in (2, 3):
        cfg_file = tmp_path / f"c{n}.json"
        cfg_file.write_text(json.dumps([c.to_dict() for c in configs[:n]]))
        stats = collect(problems, str(cfg_file), str(out), **kw)
    assert stats["measured"] == 2  # the second run: one new config per problem
    rows = dataset.load(out).to_pylist()
    assert len(rows) == 2 * 4
    for _, p in problems:
        mine = [r for r in rows if r["problem_key"] == p.key()]
        assert {r["backend"] for r in mine} == {"quack", "aten"}
        assert {dataset.problem_of(r) for r in mine} == {p}
        assert {r["expert_counts"] for r in mine} == {json.dumps(list(routed_counts(p, 0)))}
        assert all(r["experts"] == p.experts and r["gemm"] == "fwd" for r in mine)


def test_collect_measures_each_routing_asked_and_resumes_each(tmp_path):
    """With routings, a grouped problem is measured under each (its ATen row too), each
    routing's rows are their own measurements (kept apart when the dataset loads), and a
    rerun with one more routing measures only that one; an unknown routing is named."""
    import json

    from cutetune.space.enumerate import enumerate_configs
    from cutetune.space.problem import GroupedProblem
    from cutetune.tuner.measure.collect import routed_counts

    p = GroupedProblem(8, 1000, 1024, 2048)
    cfg_file = tmp_path / "c.json"
    cfg_file.write_text(json.dumps([c.to_dict() for c in enumerate_configs("sm90", p)[:2]]))
    out = tmp_path / "ds"
    kw = dict(compile_workers=1, cache_dir=str(tmp_path / "cache"), gpu_init=fake_init,
              compile_fn=fake_compile, measure_fn=grouped_fake_measure)
    assert collect([("t", p)], str(cfg_file), str(out), routings=["balanced"], **kw)[
        "measured"] == 3
    assert collect([("t", p)], str(cfg_file), str(out), routings=["balanced", "skewed"],
                   **kw)["measured"] == 3
    rows = dataset.load(out).to_pylist()
    by_routing = {r: [x for x in rows if x["expert_counts"] == r] for r in
                  (dataset.routing_text(routed_counts(p, 0, k)) for k in ("balanced", "skewed"))}
    assert [len(v) for v in by_routing.values()] == [3, 3] and len(rows) == 6
    with pytest.raises(ValueError, match="unknown routing uniform; known: balanced"):
        collect([("t", p)], str(cfg_file), str(out), routings=["uniform"], **kw)


def test_a_version_1_dataset_part_reads_with_the_grouped_columns_null(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    old = pa.schema([f for f in dataset.SCHEMA if f.name not in dataset.ADDED_IN[2]])
    row = {**{f.name: None for f in old}, "schema_version": 1, "problem_key": "p",
           "backend": "cublas", "config_key": "", "status": "ok", "time_ms": 1.0}
    tmp_path.mkdir(exist_ok=True)
    pq.write_table(pa.Table.from_pylist([row], schema=old), tmp_path / "part-000000-x.parquet")
    t = dataset.load(tmp_path)
    assert t.column("experts").to_pylist() == [None] and t.column("time_ms").to_pylist() == [1.0]
    # resuming it reads its keys, the routing (added in version 2) null
    assert dataset.done_keys(tmp_path) == {dataset.measurement_key("p", "cublas")}
    assert dataset.load(tmp_path, columns=["problem_key", "expert_counts"]).column_names == [
        "problem_key", "expert_counts"]


def test_a_part_stores_times_as_float32_and_reads_them_back_as_the_schema_has_them(tmp_path):
    """Version 3 stores the times as float32 and the timestamp as integer ms; a part of
    version 2 (float64 seconds) and one of version 3 read back alike, in the schema's types."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    row = {**{f.name: None for f in dataset.SCHEMA}, "schema_version": 2, "problem_key": "p",
           "backend": "cublas", "config_key": "", "status": "ok", "time_ms": 0.123456789,
           "time_ms_p20": 0.12, "compile_s": 3.3, "timestamp": 1796476725.4144342}
    (tmp_path / "v2").mkdir()
    pq.write_table(pa.Table.from_pylist([row], schema=dataset.SCHEMA),
                   tmp_path / "v2" / "part-000000-x.parquet")
    part = dataset.append(tmp_path / "v3", [{**row, "schema_version": None}])
    stored = pq.read_table(part)
    assert stored.schema.field("time_ms").type == pa.float32()
    assert stored.schema.field("timestamp").type == pa.int64()
    assert stored.column("schema_version").to_pylist() == [3]
    old, new = (dataset.load(tmp_path / v).to_pylist()[0] for v in ("v2", "v3"))
    assert new["time_ms"] == float(np.float32(old["time_ms"])) != old["time_ms"]
    assert abs(new["timestamp"] - old["timestamp"]) < 5e-4
    assert dataset.load(tmp_path / "v3").schema == dataset.load(tmp_path / "v2").schema
    # compacted, a version 2 part is rewritten as version 3
    dataset.compact(tmp_path / "v2")
    assert dataset.load(tmp_path / "v2").to_pylist() == [new]
    # a timestamp another tool left non-finite is stored as null, not refused
    part = dataset.append(tmp_path / "nan", [{**row, "timestamp": float("nan")}])
    assert dataset.load(tmp_path / "nan").column("timestamp").to_pylist() == [None]


def test_a_row_of_a_problem_the_rules_now_reject_is_named():
    """A dataset measured before a rule (here K=1 with an m-major A) names the problem."""
    p = GemmProblem(64, 64, 64, a_major="m", b_major="n")
    row = {**p.to_dict(), "k": 1, "problem_key": "sm90:bf16->bf16:mn:b1:m64:n64:k1"}
    with pytest.raises(dataset.DatasetError, match="rows of sm90:bf16->bf16:mn:b1:m64:n64:k1 "
                                                   "measure a problem this cutetune rejects"):
        dataset.problem_of(row)


def test_relative_error_differences_a_slice_at_a_time(monkeypatch):
    """The check's error is the whole output's, whatever the slices (here one row of fp32
    difference each), and NaN where the output holds one."""
    import torch

    from cutetune.tuner.measure import timing

    g = torch.Generator().manual_seed(0)
    ref = torch.randn(5, 3, 4, generator=g)
    got = (ref + 0.01 * torch.randn(5, 3, 4, generator=g)).bfloat16()
    whole = float(torch.linalg.vector_norm(got.float() - ref) / torch.linalg.vector_norm(ref))
    monkeypatch.setattr(timing, "ERROR_CHUNK_BYTES", 4 * 12)
    norm = torch.linalg.vector_norm(ref)
    assert timing.relative_error(got, ref, norm) == pytest.approx(whole, rel=1e-6)
    got[4, 2, 3] = float("nan")
    assert math.isnan(timing.relative_error(got, ref, norm))
    zero = torch.zeros(2, 3)  # as a tensor's division by a zero norm
    assert math.isnan(timing.relative_error(zero, zero, torch.tensor(0.0)))
    assert timing.relative_error(zero + 1, zero, torch.tensor(0.0)) == math.inf


def test_an_unstable_measurement_is_timed_again_and_the_tightest_try_kept(monkeypatch):
    """Repeats that disagree (p80 - p20 above half the median) are timed again, up to the
    policy's retimes; the row holds the tightest try, and a try that fails numerics fails it."""
    from types import SimpleNamespace

    from cutetune.tuner.measure import timing

    bimodal, wider, tight = [4.0] * 3 + [30.0] * 7, [1.0] * 5 + [30.0] * 5, [5.0] * 9 + [5.5]
    buf = SimpleNamespace(problem=GemmProblem(64, 64, 512))

    def outcome(*tries, retimes=2):
        script = iter(tries)
        monkeypatch.setattr(timing, "time_launches", lambda fn, b, policy: next(script))
        return timing.timed_outcome(None, buf, timing.TimingPolicy(retimes=retimes))

    stable = outcome((tight, 1e-3))
    assert (stable["retimes"], stable["time_ms"], stable["status"]) == (0, 5.0, "ok")
    fixed = outcome((bimodal, 1e-3), (tight, 1e-3))
    assert (fixed["retimes"], fixed["time_ms"], fixed["n_reps"]) == (1, 5.0, 10)
    kept = outcome((bimodal, 1e-3), (wider, 1e-3), (bimodal, 1e-3))
    assert kept["retimes"] == 2 and kept["time_ms"] == 30.0 and kept["time_ms_p20"] == 4.0
    assert timing.spread(bimodal) < timing.spread(wider)
    assert outcome((bimodal, 1e-3), retimes=0)["retimes"] == 0
    assert kept["unstable"] and not fixed["unstable"]
    bad = outcome((bimodal, 1e-3), (tight, float("nan")))
    assert bad["status"] == "wrong_result" and "nan" in bad["error"]
    wrong = outcome((bimodal, 1.0))  # failed numerics: not worth timing again
    assert wrong["status"] == "wrong_result" and wrong["retimes"] == 0
    worse = outcome((bimodal, 1e-3), (tight, float("inf")))
    assert worse["status"] == "wrong_result" and "inf" in worse["error"]


def unstable_measure(task):
    """Rows as timing.measure returns them, each config's tries as its tile_n says."""
    rows = [{**_row(task, c), "retimes": int(c.tile_n > 16), "unstable": c.tile_n > 100}
            for c in task.configs]
    return [{**_row(task, None), "retimes": 0, "unstable": False}] + rows


def test_collect_counts_the_retimed_and_still_unstable_measurements(tmp_path):
    import json

    cfg_file = tmp_path / "configs.json"
    picked = [c for c in _configs() if c.tile_n in (16, 64, 96, 128)]
    cfg_file.write_text(json.dumps([c.to_dict() for c in picked]))
    out = tmp_path / "ds"
    stats = collect([("t", GemmProblem(256, 512, 1024))], str(cfg_file), str(out),
                    compile_workers=1, cache_dir=str(tmp_path / "cache"),
                    measure_fn=unstable_measure, gpu_init=fake_init, compile_fn=fake_compile)
    assert (stats["retimed"], stats["unstable_after_retimes"]) == (3, 1)
    assert not {"retimes", "unstable"} & set(dataset.load(out).column_names)
