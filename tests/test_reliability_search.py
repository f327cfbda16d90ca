"""Reliability of tuning and collection on a CPU host: a trial left in flight by a killed,
interrupted or failing process never wedges a study; bad storage URLs, a missing GPU and
impossible counts or times are one-line errors. The tuning runs replay the committed H200
dataset (data/inputs/h200_bf16) or the synthetic one of test_replay.py."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import warnings
from datetime import datetime, timedelta
from pathlib import Path

import importlib.util

import optuna
import pytest
from optuna.trial import TrialState

from cutetune.cli import main
from cutetune.space import GemmProblem, enumerate_configs
from cutetune.tuner.search import storage as st
from cutetune.tuner.search.backends import ReplayBackend
from cutetune.tuner.search.samplers import (ATTR_KEY, ATTR_STATUS, ATTR_TIME, ListSampler,
    ModelGuidedSampler, SpaceEncoding)
from cutetune.tuner.search.study import Budget, open_study, tune_study
from test_replay import ModelLikeScorer, synthetic_table

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "data" / "inputs" / "h200_bf16"
# an exhaustively recorded problem of data/inputs/h200_bf16 (the example)
DIMS = ["--m", "128", "--n", "4096", "--k", "4096"]
PROBLEM = GemmProblem(256, 4096, 2048)  # test_replay's synthetic data

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _one_line(capsys, rc: int, command: str) -> str:
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert rc == 2 and out.out == "" and len(lines) == 1, out.err
    assert lines[0].startswith(f"cutetune {command}: error: "), lines[0]
    return lines[0]


# ---------------------------------------------------------------- a trial left in flight
def _trial_states(db: Path) -> list[str]:
    """The states of the study's trials, a RUNNING one as "MEASURING" once it has its holder
    (past its first heartbeat); [] until the subprocess has created the tables."""
    try:
        with sqlite3.connect(db, timeout=5) as c:
            return [("MEASURING" if s == "RUNNING" and held else s) for s, held in c.execute(
                "SELECT state, EXISTS(SELECT 1 FROM trial_user_attributes a WHERE a.trial_id ="
                " t.trial_id AND a.key = ?) FROM trials t ORDER BY number", (st.HOLDER_ATTR,))]
    except sqlite3.OperationalError:  # not created yet
        return []


def _tune_argv(db: Path, results: Path, *extra) -> list[str]:
    return ["tune", *DIMS, "--backend", f"replay:{RECORDED}", "--storage", f"sqlite:///{db}",
            "--heartbeat", "1", "--results", str(results), *extra]


def test_killed_tune_reruns_only_what_is_missing(tmp_path):
    """SIGKILL a model-guided tune while it measures its second config; a rerun fails the
    trial left RUNNING once its heartbeat is stale, measures exactly the configs that the
    uninterrupted run measured after the first, and finds the same best."""
    killed_db, killed_out = tmp_path / "killed.db", tmp_path / "killed.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "cutetune",
                             *_tune_argv(killed_db, killed_out, "--replay-delay", "0.4")],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while _trial_states(killed_db) != ["COMPLETE", "MEASURING"]:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, _trial_states(killed_db)
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _trial_states(killed_db) == ["COMPLETE", "MEASURING"]
    # the uninterrupted reference runs while the dead trial goes stale
    assert main(_tune_argv(tmp_path / "whole.db", tmp_path / "whole.jsonl")) == 0
    (whole,) = [json.loads(x) for x in (tmp_path / "whole.jsonl").read_text().splitlines()]
    storage = st.open_storage(f"sqlite:///{killed_db}", heartbeat_s=1)
    study_id = storage.get_study_id_from_name(whole["study"])
    deadline = time.monotonic() + 30
    while not storage._get_stale_trial_ids(study_id):  # 3 beats of 1 s (whole seconds)
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert main(_tune_argv(killed_db, killed_out)) == 0
    (rerun,) = [json.loads(x) for x in killed_out.read_text().splitlines()]
    assert whole["configs_in_order"][1:] == rerun["configs_in_order"]
    assert (rerun["best_config"], rerun["best_ms"]) == (whole["best_config"], whole["best_ms"])
    study = optuna.load_study(study_name=rerun["study"], storage=storage)
    states = [t.state for t in study.trials]
    assert states[1] == TrialState.FAIL and ATTR_KEY not in study.trials[1].user_attrs
    keys = [t.user_attrs[ATTR_KEY] for t in study.trials if t.state == TrialState.COMPLETE]
    assert states.count(TrialState.COMPLETE) == len(states) - 1 == whole["trials"]
    assert keys == whole["configs_in_order"]  # each once, nothing measured twice


@pytest.fixture(scope="module")
def backend():
    return ReplayBackend(synthetic_table([PROBLEM]))


@pytest.fixture(scope="module")
def encoding():
    return SpaceEncoding(enumerate_configs(PROBLEM.arch, PROBLEM))


def _measured(study, encoding, config, backend) -> None:
    """Tell ``study`` a trial of ``config`` that another process measured."""
    m = backend.fresh().measure(PROBLEM, [config])[0]
    study.add_trial(optuna.trial.create_trial(
        params=encoding.encode(config), distributions=encoding.distributions(),
        value=m.time_ms, user_attrs={ATTR_KEY: config.short(), ATTR_STATUS: m.status,
                                     ATTR_TIME: m.time_ms}))


def test_a_trial_in_flight_neither_stops_nor_freezes_the_sampler(backend, encoding):
    """The issue's wedge: a RUNNING trial first in the study (left by a killed run) made
    seen() stop there, so every later measurement went unseen and next_config kept
    proposing one config. Now later trials are read, the running trial's config is not
    proposed again, and the choice moves on as trials finish."""
    sampler = ModelGuidedSampler(encoding, PROBLEM, ModelLikeScorer())
    study = optuna.create_study(sampler=sampler)
    first = sampler.next_config(study)
    left = study.ask(encoding.distributions())  # the killed run's trial: RUNNING for good
    assert encoding.decode(left.params) == first
    second = sampler.next_config(study)
    assert second != first  # not proposed twice while in flight
    _measured(study, encoding, second, backend)
    assert set(sampler.seen(study)) == {second.short()}
    third = sampler.next_config(study)
    assert third not in (first, second)
    _measured(study, encoding, third, backend)
    study.tell(left, state=TrialState.FAIL)  # failed as stale: its config is free again
    assert set(sampler.seen(study)) == {second.short(), third.short()}
    assert sampler.next_config(study) not in (second, third)


def test_tune_waits_for_a_config_another_process_measures(tmp_path, backend, encoding):
    """`tune --workers N`: a strategy with nothing left but a config another process is
    measuring waits for its result instead of stopping or measuring it again."""
    listed = list(encoding.candidates[:3])
    url = f"journal:{tmp_path / 'j.journal'}"
    mine = ListSampler(encoding, listed)
    study = open_study(PROBLEM, encoding, mine, st.open_storage(url, heartbeat_s=1), "s")
    # the other process: its own storage, a trial of listed[0] with a heartbeat and holder
    other_storage = st.open_storage(url, heartbeat_s=1)
    other = optuna.load_study(study_name="s", storage=other_storage)
    other.enqueue_trial(encoding.encode(listed[0]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # heartbeats outside optimize()
        held = other.ask(encoding.distributions())
    other_storage.record_heartbeat(held._trial_id)
    held.set_user_attr(st.HOLDER_ATTR, "elsewhere:1")
    m = backend.fresh().measure(PROBLEM, listed[:1])[0]

    def finish():
        time.sleep(1.0)
        for k, v in ((ATTR_KEY, listed[0].short()), (ATTR_STATUS, m.status),
                     (ATTR_TIME, m.time_ms)):
            held.set_user_attr(k, v)
        other.tell(held, m.time_ms)

    t = threading.Thread(target=finish)
    t.start()
    started = time.monotonic()
    result = tune_study(study, mine, PROBLEM, encoding, backend.fresh(), Budget(trials=10))
    t.join()
    assert time.monotonic() - started >= 0.9  # it waited for the other's result
    assert [s.config for s in result.steps] == listed[1:] and not any(s.reused for s in result.steps)
    assert result.stop_reason == "measured all 3 listed configs"
    assert result.best()[1] == min(backend.recorded(PROBLEM, c).time_ms or float("inf")
                                   for c in listed)
    assert sorted(t.user_attrs[ATTR_KEY] for t in study.trials) == sorted(c.short() for c in listed)


class Interrupting:
    """A backend whose second measurement raises ``error`` (Ctrl-C, a failed GPU worker)."""

    def __init__(self, inner, error):
        self.inner, self.error, self.calls = inner, error, 0

    def measure(self, problem, configs):
        self.calls += 1
        if self.calls == 2:
            raise self.error
        return self.inner.measure(problem, configs)


@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("GPU worker died")])
def test_an_interrupted_trial_is_failed_not_left_running(tmp_path, backend, encoding, error):
    url = f"sqlite:///{tmp_path / 's.db'}"
    listed = list(encoding.candidates[:3])
    study = open_study(PROBLEM, encoding, ListSampler(encoding, listed),
                       st.open_storage(url, max_retry=0), "s")
    with pytest.raises(type(error)):
        tune_study(study, study.sampler, PROBLEM, encoding,
                   Interrupting(backend.fresh(), error), Budget())
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.FAIL]
    # a rerun (a new process) measures what is missing, at once
    sampler = ListSampler(encoding, listed)
    study = open_study(PROBLEM, encoding, sampler, st.open_storage(url, max_retry=0), "s")
    result = tune_study(study, sampler, PROBLEM, encoding, backend.fresh(), Budget())
    assert [s.config for s in result.steps] == listed[1:]


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_stale_trials_are_failed(tmp_path, kind):
    """A RUNNING trial is failed when its heartbeat is older than the grace period, or when
    it never had one (no holder) and started longer ago than that; a live one is kept."""
    url = (f"journal:{tmp_path / 'j.journal'}" if kind == "journal"
           else f"sqlite:///{tmp_path / 's.db'}")
    storage = st.open_storage(url, heartbeat_s=1, max_retry=0)
    study = optuna.create_study(study_name="s", storage=storage)
    legacy = optuna.trial.create_trial(state=TrialState.RUNNING)  # from before heartbeats
    legacy.datetime_start = datetime.now() - timedelta(hours=1)
    study.add_trial(legacy)
    study.add_trial(optuna.trial.create_trial(state=TrialState.RUNNING))  # before its 1st beat
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        live = study.ask()
    storage.record_heartbeat(live._trial_id)
    live.set_user_attr(st.HOLDER_ATTR, st.holder_name())
    st.fail_stale_trials(study)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.RUNNING,
                                               TrialState.RUNNING]
    if kind == "journal":  # a heartbeat older than 3 beats of 1 s
        storage.set_trial_system_attr(live._trial_id, st.HEARTBEAT_ATTR, time.time() - 10)
        st.fail_stale_trials(study)
        assert study.trials[live.number].state == TrialState.FAIL


def test_journal_lock_of_a_killed_process_is_free_at_once(tmp_path):
    """A process killed while it appends to a journal leaves no lock behind (Optuna's
    default symlink lock made the next process wait 30 s)."""
    journal = tmp_path / "j.journal"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from cutetune.tuner.search.storage import "
         "open_storage; open_storage(sys.argv[1]).append_lock.acquire(); "
         "print('held', flush=True); time.sleep(60)", f"journal:{journal}"],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
    t0 = time.monotonic()
    optuna.create_study(study_name="s", storage=st.open_storage(f"journal:{journal}"))
    assert time.monotonic() - t0 < 5


# ---------------------------------------------------------------- bad storage URLs
def _bad_urls(tmp_path) -> list[tuple[str, str]]:
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n")
    binary = tmp_path / "blob.bin"
    binary.write_bytes(bytes(range(256)) * 8)
    return [
        ("foo://bar", "--storage must be journal:PATH or sqlite:///FILE"),
        ("bar", "got 'bar'"),
        ("postgresql://cutetune@127.0.0.1:1/none",
         "cannot open storage postgresql://cutetune@127.0.0.1:1/none: OperationalError"
         if importlib.util.find_spec("psycopg") else  # without the [fleet] extra
         "a PostgreSQL storage needs the psycopg driver: pip install 'cutetune[fleet]'"),
        (f"sqlite:///{text}", "file is not a database"),
        (f"sqlite:///{tmp_path}/no/such/dir/s.db", "unable to open database file"),
        (f"journal:{text}", f"{text} is not an Optuna journal file"),
        (f"journal:{binary}", f"{binary} is not an Optuna journal file"),
        (f"journal:{tmp_path}", "is a directory"),
    ]


def test_bad_storage_urls_are_one_line_in_tune_and_fleet(tmp_path, capsys):
    for url, words in _bad_urls(tmp_path):
        rc = main(["tune", *DIMS, "--strategy", "random", "--backend", f"replay:{RECORDED}",
                   "--storage", url])
        line = _one_line(capsys, rc, "tune")
        assert words in line, line
        rc = main(["fleet", "status", "--storage", url, "--study", "s"])
        assert _one_line(capsys, rc, "fleet").split(": error: ")[1] == line.split(": error: ")[1]


def test_missing_psycopg_names_the_fleet_extra(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # `import psycopg` fails
    rc = main(["fleet", "status", "--storage", "postgresql://u@127.0.0.1:1/db", "--study", "s"])
    assert "pip install 'cutetune[fleet]'" in _one_line(capsys, rc, "fleet")


# ---------------------------------------------------------------- no GPU
@pytest.fixture(params=["cpu-torch", "no-driver"])
def no_gpu(request, monkeypatch):
    """A host without a usable CUDA GPU, whatever this one has: a CPU build of torch, or a
    CUDA build that finds no driver (torch then warns and counts 0 devices). Returns the
    reason the error must give."""
    import torch

    if request.param == "cpu-torch":
        monkeypatch.setattr(torch.version, "cuda", None)
        return "is built without CUDA"

    def no_driver():
        warnings.warn("CUDA initialization: Found no NVIDIA driver on your system. (Triggered "
                      "internally at /pytorch/c10/cuda/CUDAFunctions.cpp:119.)")
        return 0

    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "device_count", no_driver)
    return "no CUDA GPU: Found no NVIDIA driver on your system. (--backend replay:PATH"


def test_no_gpu_is_one_line_before_any_worker_starts(tmp_path, capsys, no_gpu):
    for argv, command in (
            (["collect", "--out", str(tmp_path / "ds")], "collect"),
            (["collect", "--workers", "2", "--storage", f"sqlite:///{tmp_path / 'q.db'}",
              "--out", str(tmp_path / "ds")], "collect"),
            (["tune", *DIMS, "--storage", f"journal:{tmp_path / 'j.journal'}",
              "--workers", "2"], "tune")):
        line = _one_line(capsys, main(argv), command)
        assert "no CUDA GPU: " in line and no_gpu in line, line
    assert not (tmp_path / "ds").exists()


# ---------------------------------------------------------------- counts and times
@pytest.mark.parametrize("argv, message", [
    (["tune", *DIMS, "--trials", "0"], "--trials must be >= 1, got 0"),
    (["tune", *DIMS, "--trials", "-1"], "--trials must be >= 1, got -1"),
    (["tune", *DIMS, "--workers", "0"], "--workers must be >= 1, got 0"),
    (["tune", *DIMS, "--time-budget", "0"], "--time-budget must be > 0, got 0.0"),
    (["tune", *DIMS, "--heartbeat", "0"], "--heartbeat must be >= 1, got 0"),
    (["tune", *DIMS, "--replay-delay", "-1"], "--replay-delay must be >= 0, got -1.0"),
    (["tune", *DIMS, "--margin", "nan"], "--margin must be >= 0, got nan"),
    (["collect", "--workers", "0"], "--workers must be >= 1, got 0"),
    (["collect", "--item-size", "0"], "--item-size must be >= 1, got 0"),
    (["collect", "--max-retry", "-1"], "--max-retry must be >= 0, got -1"),
    (["collect", "--time-budget", "-5"], "--time-budget must be > 0, got -5.0"),
    (["collect", "--target-ms", "0"], "--target-ms must be > 0, got 0.0"),
    (["collect", "--limit-problems", "0"], "--limit-problems must be >= 1, got 0"),
    (["space", "check", "--timeout", "-1"], "--timeout must be > 0, got -1.0"),
    (["space", "check", "--sample", "0"], "--sample must be >= 1, got 0"),
    (["prebuild", "--workers", "0"], "--workers must be >= 1, got 0"),
    (["train", "ds", "--out", "m.json", "--trees", "0"], "--trees must be >= 1, got 0"),
    (["train", "ds", "--out", "m.json", "--depth", "-1"], "--depth must be >= 1, got -1"),
    (["emit", "--out", "h.json", "--exact-margin", "nan"],
     "--exact-margin must be >= 0.0, got nan"),
    (["emit", "--out", "h.json", "--exact-margin", "-0.5"],
     "--exact-margin must be >= 0.0, got -0.5"),
])
def test_counts_and_times_are_refused_while_parsing(capsys, argv, message):
    line = _one_line(capsys, main(argv), argv[0])
    assert line.endswith(message), line


# ---------------------------------------------------------------- collect's inputs and outputs
@pytest.mark.parametrize("option, make, message", [
    ("--out", lambda p: p.write_text("x"), "dataset folder {} is a file; give a folder"),
    ("--stats", lambda p: p.mkdir(), "stats file {} is a directory; give a file path"),
    ("--cache-dir", lambda p: p.write_text("x"), "kernel cache folder {} cannot be used (File "
                                                 "exists); give a folder (--cache-dir, "),
])
def test_collect_refuses_unusable_outputs_before_any_work(capsys, tmp_path, option, make,
                                                          message):
    """Checked before the problems and any measurement, a fleet's too (a replaying one here:
    on one host, the GPU check comes first)."""
    bad = tmp_path / "bad"
    make(bad)
    argv = ["collect", "--problems", "no-such-suite", "--out", str(tmp_path / "ds"),
            "--storage", f"sqlite:///{tmp_path / 'q.db'}", "--backend",
            f"replay:{tmp_path / 'no-such-dataset'}", option, str(bad)]
    line = _one_line(capsys, main(argv), "collect")
    assert message.format(bad) in line, line


@pytest.mark.parametrize("content, words", [
    ({"m": 128, "n": 256, "k": 512}, "must hold a non-empty list of problem objects"),
    ([], "(empty)"),
    ([{"m": 128, "n": 256, "k": 512}, {"m": 128, "n": 256}], "item 1"),
    ([{"m": 128, "n": 256, "k": 512, "q": 1}], "item 0"),
    ([{"m": -1, "n": 256, "k": 512}], "item 0"),
    (["m=1"], "item 0 ('m=1'): an object of sizes, not a str"),
    ([[["m", 128], ["n", 256], ["k", 512]]], "an object of sizes, not a list"),
    ([{"m": 128, "n": 256, "k": 512, "suite": 5}], "item 0 ({'m': 128, 'n': 256, 'k': 512, "
                                                   "'suite': 5}): its suite must be a name"),
    (0, "problem objects ({\"m\": ..., \"n\": ..., \"k\": ...}), got int"),
])
def test_a_problems_file_of_the_wrong_content_names_itself_and_the_item(tmp_path, content, words):
    from cutetune.tuner.measure.collect import load_problems

    f = tmp_path / "mine.json"
    f.write_text(json.dumps(content))
    with pytest.raises(ValueError) as e:
        load_problems(str(f), "bf16", "sm90", 0)
    assert str(f) in str(e.value) and words in str(e.value)
    assert str(e.value).endswith("(empty)") == (content == [])
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps([{"m": 128, "n": 256, "k": 512}]))
    assert [(s, p.m) for s, p in load_problems(str(ok), "bf16", "sm90", 0)] == [("ok", 128)]


@pytest.mark.parametrize("spec,what", [
    ("sample:abc", "a count N"), ("sample:0", "a count N"), ("sample:-1", "a count N"),
    ("sample:", "a count N"), ("sample:0@300", "a count N"), ("sample:5@0", "a pool size K"),
    ("sample:5@x", "a pool size K"), ("sample:5@", "a pool size K")])
def test_a_bad_config_sample_names_the_option(spec, what, capsys, no_gpu):
    """Refused as the command is read: before the GPU check (none here) and any work."""
    from cutetune.space import GemmProblem
    from cutetune.tuner.measure.collect import configs_for

    message = f"--configs sample:N[@K] needs {what} >= 1, got '{spec}'"
    assert message in _one_line(capsys, main(["collect", "--configs", spec]), "collect")
    with pytest.raises(ValueError, match=re.escape(message)):
        configs_for(GemmProblem(128, 256, 512), spec, 0)
    assert len(configs_for(GemmProblem(128, 256, 512), "sample:3", 0)) == 3


def test_a_misspelt_routing_or_layout_is_named_before_the_gpu_check(capsys, no_gpu):
    for argv, words in ((["--routings", "balancd"], "balancd"), (["--layouts", "kx"], "kx")):
        line = _one_line(capsys, main(["collect", *argv]), "collect")
        assert words in line and "no CUDA GPU" not in line, line


def test_training_without_the_baselines_packages_is_refused_before_it_starts(
        capsys, tmp_path, monkeypatch):
    """scikit-learn and nvMatmulHeuristics are the "baselines" extra: missing, training
    refuses at once (it failed minutes in), and --no-baselines does without them."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in (
        "sklearn", "nvMatmulHeuristics") else real(name, *a))
    argv = ["train", "data/inputs/h200_bf16", "--out", str(tmp_path / "m.json")]
    line = _one_line(capsys, main(argv), "train")
    assert line.endswith('the baselines need scikit-learn, nvidia-matmul-heuristics: pip install '
                         '-e ".[baselines]", or train with --no-baselines'), line
    assert not (tmp_path / "m.json").exists()
