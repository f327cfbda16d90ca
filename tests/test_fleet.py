"""Fleet collection: work items queued in an Optuna RDB storage, shared by worker processes.

The fleet runs replay the committed H200 dataset (data/inputs/h200_bf16): every row a worker
stores is a recorded GPU measurement, copied as recorded. The PostgreSQL test needs a server
named by CUTETUNE_TEST_PG_URL (`bash .ci/start_postgres.sh` starts one and prints it); without
one it skips, except under CI=true, where it fails.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from cutetune.errors import CutetuneError
from cutetune.models import dataset
from cutetune.models.dataset import measurement_key as key
from cutetune.space import GemmProblem, KernelConfig
from cutetune.tuner.fleet import plan as fplan, queue as fqueue, run as frun
from cutetune.tuner.measure import timing
from cutetune.tuner.search import storage as fstorage
from cutetune.tuner.measure.collect import configs_for, load_problems
from cutetune.tuner.measure.executor import GpuExecutor
from test_collect import COMPILE_FAIL_TILE_N, CRASH_TILE_N, fake_compile, fake_init, fake_measure

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "data" / "inputs" / "h200_bf16"
CONFIGS = "sample:150"  # how data/inputs/h200_bf16's train problems were collected


@pytest.fixture(scope="module")
def recorded() -> dict:
    t = dataset.load(RECORDED)
    return {dataset.row_key(r): r for r in t.to_pylist()}


def _recorded_problems(recorded: dict, n: int) -> list[dict]:
    """The first n train problems whose sampled configs and cuBLAS row are all recorded."""
    out = []
    for suite, p in load_problems("train", "bf16", "sm90", 0):
        keys = [key(p.key(), "cublas")] + [key(p.key(), "quack", c.short())
                                           for c in configs_for(p, CONFIGS, 0)]
        if all(k in recorded for k in keys):
            out.append({"m": p.m, "n": p.n, "k": p.k, "suite": suite})
        if len(out) == n:
            return out
    raise AssertionError(f"data/inputs/h200_bf16 has fewer than {n} fully recorded train "
                         "problems")


def _collect(tmp_path, problems: list[dict], storage: str, workers: int, item_size: int,
             heartbeat: int, delay: float) -> tuple[subprocess.Popen, str]:
    pfile = tmp_path / "problems.json"
    pfile.write_text(json.dumps(problems))
    study = f"test-{uuid.uuid4().hex[:12]}"
    cmd = [sys.executable, "-m", "cutetune", "collect", "--problems", str(pfile),
           "--configs", CONFIGS, "--out", str(tmp_path / "out"), "--storage", storage,
           "--study", study, "--workers", str(workers), "--item-size", str(item_size),
           "--backend", f"replay:{RECORDED}", "--replay-delay", str(delay),
           "--heartbeat", str(heartbeat), "--stats", str(tmp_path / "stats.json")]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True), study


def _check_exactly_once(storage, study_name: str, out: Path, problems: list[dict],
                        recorded: dict) -> optuna.Study:
    """Every planned item has exactly one COMPLETE trial, and the exported dataset holds each
    recorded row of the plan once, as recorded."""
    study = optuna.load_study(study_name=study_name, storage=storage)
    plan = fplan.Plan.from_json(study.user_attrs[fplan.PLAN_ATTR])
    complete = Counter(t.user_attrs[fplan.ITEM_ATTR]
                       for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    assert set(complete) == set(plan.items)
    assert set(complete.values()) == {1}
    rows = dataset.load(out).to_pylist()
    keys = [dataset.row_key(r) for r in rows]
    assert len(keys) == len(set(keys)) == len(problems) * (150 + 1)
    for k, r in zip(keys, rows):
        # as recorded, to the float32 a dataset part stores
        assert r["time_ms"] == float(np.float32(recorded[k]["time_ms"]))
        assert r["device_name"] == "NVIDIA H200"
    return study


def test_export_appends_rows_as_a_gpu_worker_makes_them(tmp_path):
    """A dense row as the GPU harness makes it has no expert_counts (the dataset writes it
    null): export keys and appends it, once."""
    from cutetune.tuner.fleet.queue import encode_rows

    study = optuna.create_study()
    row = {"problem_key": "p", "backend": "cublas", "config_key": "", "status": "ok",
           "time_ms": 1.0}
    for item in ("p#0", "p#0"):  # a duplicate item's rows count once
        trial = study.ask()
        trial.set_user_attr(fplan.ITEM_ATTR, item)
        trial.set_user_attr(fplan.ROWS_ATTR, encode_rows([row]))
        study.tell(trial, 0.0)
    got = frun.export(study, str(tmp_path / "out"))
    assert (got["appended"], got["duplicate_items"]) == (1, 1)
    assert dataset.done_keys(tmp_path / "out") == {key("p", "cublas")}


def test_export_refuses_another_gpus_rows(tmp_path):
    """A dataset is one device's: an export of another GPU's rows is refused whole."""
    from cutetune.tuner.fleet.queue import encode_rows

    out = tmp_path / "out"
    dataset.append(out, [{"problem_key": "p", "backend": "cublas", "config_key": "",
                          "status": "ok", "time_ms": 1.0, "device_name": "NVIDIA H200"}])
    study = optuna.create_study()
    trial = study.ask()
    trial.set_user_attr(fplan.ITEM_ATTR, "q#0")
    trial.set_user_attr(fplan.ROWS_ATTR, encode_rows([
        {"problem_key": "q", "backend": "cublas", "config_key": "", "status": "ok",
         "time_ms": 1.0, "device_name": "NVIDIA H100 80GB HBM3"}]))
    study.tell(trial, 0.0)
    with pytest.raises(ValueError, match="holds measurements of NVIDIA H200, and these are of "
                                         "NVIDIA H100 80GB HBM3"):
        frun.export(study, str(out))
    assert dataset.done_keys(out) == {key("p", "cublas")}


def test_plan_covers_pending_work_once():
    configs = tuple(KernelConfig(tile_m=128, tile_n=n, cluster_m=1)
                    for n in (64, 96, 128, 160, 192))
    work = fplan.Work("t", "sm90", "bf16", configs, 0, item_size=2)
    p1, p2, p3 = GemmProblem(256, 512, 1024), GemmProblem(64, 1024, 512), GemmProblem(128, 128, 128)
    done = {key(p1.key(), "quack", configs[0].short()), key(p2.key(), "cublas")}
    done |= {key(p3.key(), "quack", c.short()) for c in configs}
    items = fplan.plan_items([("a", p1), ("b", p2), ("a", p1), ("c", p3)], work, done)
    plan = fplan.Plan(work, {it.key: it for it in items})
    assert fplan.Plan.from_json(plan.to_json()) == plan
    got = [key(it.problem.key(), "quack", c.short()) for it in items for c in plan.configs(it)]
    want = {key(p.key(), "quack", c.short()) for p in (p1, p2, p3) for c in configs} - done
    assert len(got) == len(set(got)) and set(got) == want
    assert [it.key for it in items if it.cublas] == [f"{p1.key()}#0", f"{p3.key()}#0"]
    assert max(len(it.indices) for it in items) == 2
    assert [it.indices for it in items if it.problem == p3] == [()]  # cuBLAS alone
    with pytest.raises(ValueError, match="differ from the planning host"):
        plan.configs(dataclasses.replace(items[0], space="0" * 12))


def test_plan_takes_a_sampled_problem_as_done_at_its_count():
    """As collect does: 'sample:N' plans for a problem only what it lacks of N quack rows,
    whichever configs it holds."""
    work = fplan.Work("t", "sm90", "bf16", "sample:4", 0, item_size=8)
    p = GemmProblem(256, 512, 1024)
    other = [c for c in fplan.configs_for(p, "sample:40", 7) if c not in work.candidates(p)]
    done = {key(p.key(), "quack", c.short()) for c in other[:3]} | {key(p.key(), "cublas")}
    items = fplan.plan_items([("a", p)], work, done)
    assert [len(it.indices) for it in items] == [1]
    done.add(key(p.key(), "quack", other[3].short()))
    assert fplan.plan_items([("a", p)], work, done) == []


def test_gpu_executor_isolates_failures(tmp_path):
    """The GPU worker's scheduling, with the hardware edges swapped for test_collect's CPU
    stand-ins: a config that kills the GPU worker and one that does not compile are recorded
    with that status, the rest of their items measured."""
    configs = [KernelConfig(tile_m=128, tile_n=n, pingpong=True, cluster_m=1, cluster_n=1)
               for n in (16, COMPILE_FAIL_TILE_N, CRASH_TILE_N, 64, 128)]
    items = [fplan.WorkItem(f"i{j}", "t", GemmProblem(256 * (j + 1), 512, 1024),
                            tuple(range(len(configs))), True, "") for j in range(2)]
    ex = GpuExecutor("sm90", str(tmp_path / "cache"), 1, timing.TimingPolicy(),
                     measure_fn=fake_measure, gpu_init=fake_init, compile_fn=fake_compile)
    try:
        for j, it in enumerate(items):
            ex.submit(100 + j, it, configs)
        done, deadline = [], time.monotonic() + 120
        while len(done) < 2 and time.monotonic() < deadline:
            done += ex.poll(0.5)
    finally:
        ex.close()
    assert sorted(d.job_id for d in done) == [100, 101]
    for d in done:
        status = {(r["backend"], r.get("tile_n")): r["status"] for r in d.rows}
        assert len(d.rows) == len(configs) + 1 and not d.error
        assert status == {("cublas", None): "ok", ("quack", 16): "ok", ("quack", 64): "ok",
                          ("quack", 128): "ok", ("quack", COMPILE_FAIL_TILE_N): "compile_error",
                          ("quack", CRASH_TILE_N): "crash"}


def test_sqlite_fleet_measures_each_item_once(tmp_path, recorded):
    """One host, two workers, the embedded SQLite queue; a second run finds nothing to do."""
    problems = _recorded_problems(recorded, 4)
    url = f"sqlite:///{tmp_path / 'queue.sqlite'}"
    proc, name = _collect(tmp_path, problems, url, workers=2, item_size=30, heartbeat=5,
                          delay=0.0)
    log, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, log
    storage = fstorage.open_storage(url)
    study = _check_exactly_once(storage, name, tmp_path / "out", problems, recorded)
    assert frun.status(study)["complete"] == 4 * 5  # 150 configs in items of 30
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["items_here"] == 20 and stats["rows_here"] == 4 * 151
    assert stats["steady_rows_per_min"] > 0 and stats["rows_per_min"] > 0
    work = fplan.Plan.from_json(study.user_attrs[fplan.PLAN_ATTR]).work
    _, _, enqueued = fqueue.prepare(storage, name, work, plan_fn=None)  # joins: no new plan
    assert enqueued == 0


def _pg_url() -> str:
    url = os.environ.get("CUTETUNE_TEST_PG_URL")
    why = None
    if not url:
        why = "CUTETUNE_TEST_PG_URL is not set (bash .ci/start_postgres.sh starts a server " \
              "and prints one)"
    else:
        try:
            fstorage.open_storage(url)
        except CutetuneError as e:
            why = f"PostgreSQL at CUTETUNE_TEST_PG_URL is unreachable: {e}"
    if why and os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{why}; under CI=true the fleet test must run")
    if why:
        pytest.skip(why)
    return url


def _running(storage, study_id: int) -> list:
    return storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))


def _kill_a_worker_holding_a_trial(storage, name: str, proc) -> tuple[str, list[int]]:
    """Once 10 items are done, freeze a worker that holds a RUNNING trial and SIGKILL it.
    Returns its name and the trials it held."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
        try:
            sid = storage.get_study_id_from_name(name)
        except KeyError:
            continue
        if storage.get_n_trials(sid, TrialState.COMPLETE) < 10:
            continue
        for t in _running(storage, sid):
            worker = t.user_attrs.get(fplan.WORKER_ATTR)
            if not worker:
                continue
            pid = int(worker.rsplit(":", 1)[1])
            os.kill(pid, signal.SIGSTOP)
            held = [u.number for u in _running(storage, sid)
                    if u.user_attrs.get(fplan.WORKER_ATTR) == worker]
            if held:
                os.kill(pid, signal.SIGKILL)
                return worker, held
            os.kill(pid, signal.SIGCONT)
    raise AssertionError("no worker was seen holding a RUNNING trial")


def test_postgres_fleet_survives_a_killed_worker(tmp_path, recorded):
    """200 items, 4 workers on one PostgreSQL study; one worker is SIGKILLed while it holds a
    trial. Its trial goes stale, fails, is queued again and measured by another worker: every
    item ends COMPLETE exactly once and the dataset holds every row once."""
    url = _pg_url()
    problems = _recorded_problems(recorded, 20)
    proc, name = _collect(tmp_path, problems, url, workers=4, item_size=15, heartbeat=1,
                          delay=0.05)
    storage = fstorage.open_storage(url)
    try:
        worker, held = _kill_a_worker_holding_a_trial(storage, name, proc)
        log, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, log
        assert "exited abnormally: [-9]" in log, log
        study = _check_exactly_once(storage, name, tmp_path / "out", problems, recorded)
        assert frun.status(study) == {"items": 200, "complete": 200, "running": 0,
                                       "waiting": 0, "lost": 0, "retried": len(held)}
        trials = {t.number: t for t in study.get_trials(deepcopy=False)}
        for number in held:
            dead = trials[number]
            assert dead.state == TrialState.FAIL and dead.user_attrs[fplan.WORKER_ATTR] == worker
            retries = [t for t in trials.values() if t.system_attrs.get("failed_trial") == number]
            assert [t.state for t in retries] == [TrialState.COMPLETE]
            assert retries[0].user_attrs[fplan.ITEM_ATTR] == dead.user_attrs[fplan.ITEM_ATTR]
            assert retries[0].user_attrs[fplan.WORKER_ATTR] != worker
    finally:
        if proc.poll() is None:
            proc.kill()
        try:
            optuna.delete_study(study_name=name, storage=storage)
        except KeyError:
            pass


def test_a_fleet_refuses_grouped_problems_with_one_line(tmp_path, capsys):
    """Its plan and workers know dense GEMMs only: grouped ones are collected on one host."""
    from cutetune.cli import main

    common = ["collect", "--storage", f"sqlite:///{tmp_path}/q.db", "--out", str(tmp_path / "o"),
              "--backend", f"replay:{RECORDED}"]
    assert main([*common, "--problems", "moe"]) == 2
    assert "a fleet measures dense GEMMs; moe holds grouped ones" in capsys.readouterr().err
    assert main([*common, "--problems", "moe", "--routings", "balanced"]) == 2
    assert "--routings is for grouped problems" in capsys.readouterr().err


def test_a_damaged_replayed_dataset_is_named_before_any_worker_starts(tmp_path, capsys):
    from cutetune.cli import main

    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "part-000000-00000000.parquet").write_bytes(b"not parquet")
    argv = ["collect", "--storage", f"sqlite:///{tmp_path}/q.db", "--out", str(tmp_path / "o"),
            "--backend", f"replay:{tmp_path / 'rec'}", "--problems", "llm"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    bad = tmp_path / "rec" / "part-000000-00000000.parquet"
    assert len(err) == 1 and f"corrupt dataset part {bad}" in err[0], err
    assert not (tmp_path / "q.db").exists()  # no queue made, no worker started
