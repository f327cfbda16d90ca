"""scripts/bench_e2e.py on the CPU: merging parts measured apart, and the committed H200 result
(every M and mode measured, its target checks as the script computes them)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _script(name: str):
    """scripts/NAME.py as a module."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The scripts' shared helpers, which they import as ``benchlib`` (``python scripts/NAME.py``
# finds it on sys.path): loaded by path, under that name, before any script.
benchlib = sys.modules["benchlib"] = _script("benchlib")
bench = _script("bench_e2e")
COMMITTED = REPO / "data" / "bench" / "e2e_h200.json.gz"


def _part(runs, digest="d", overhead=True):
    meta = {"ms": sorted({r["m"] for r in runs}), "heuristics_digest": digest, "total_s": 1.0}
    part = {"meta": meta, "runs": runs}
    if overhead:
        part["launch_overhead"] = {"status": "ok", "from": digest}
    return part


def test_merge_replaces_skipped_runs_with_later_parts_and_checks_heuristics():
    skipped = {"mode": "reduced", "m": 128, "kernel_cache": "cold", "status": "skipped"}
    first = _part([{"mode": "default", "m": 128, "kernel_cache": None, "status": "ok"}, skipped])
    rerun = _part([{**skipped, "status": "ok"}], overhead=False)
    merged = bench.merge([first, rerun])
    assert [(r["mode"], r["status"]) for r in merged["runs"]] == [("default", "ok"),
                                                                    ("reduced", "ok")]
    assert merged["launch_overhead"] == first["launch_overhead"]
    with pytest.raises(SystemExit, match="different heuristics"):
        bench.merge([first, _part([], digest="other")])


def test_committed_h200_result_is_complete_and_its_targets_follow_from_its_runs():
    res = json.loads(gzip.decompress(COMMITTED.read_bytes()))
    assert res["meta"]["ms"] == list(bench.MS)
    kinds = {(r["mode"], r["kernel_cache"]) for r in res["runs"] if r["status"] == "ok"}
    assert kinds == {("default", None), ("max-autotune", None), ("predicted", "cold"),
                     ("predicted", "warm"), ("reduced", "cold"), ("reduced", "warm")}
    assert len([r for r in res["runs"] if r["status"] == "ok"]) == 6 * len(bench.MS)
    assert res["targets"] == json.loads(json.dumps(bench.targets(res)))
    for r in res["runs"]:
        for w in r["workloads"].values():
            assert w["rel_err"] < 1e-2  # numerics against eager, every mode and M


def test_single_h200_result_is_complete_and_its_targets_follow_from_its_runs():
    res = json.loads(gzip.decompress((REPO / "data" / "bench" / "e2e_h200_1gpu.json.gz").read_bytes()))
    ok = [r for r in res["runs"] if r["status"] == "ok"]
    assert res["meta"]["ms"] == [1, 16, 128, 1024] and len(ok) == 6 * 4
    assert res["targets"] == json.loads(json.dumps(bench.targets(res)))
    assert all(w["rel_err"] < 1e-2 for r in ok for w in r["workloads"].values())


def test_quack_launch_host_time_follows_from_the_committed_measurements():
    """QUACK_LAUNCH_HOST_US: the default step's host time per GEMM plus what each quack GEMM
    added to the step timed beside it in one process; the larger of the two measurements."""
    from cutetune.models.triton_mm import QUACK_LAUNCH_HOST_US

    bench_dir = REPO / "data" / "bench"
    m1 = json.loads((bench_dir / "step_ab_h200_predicted_attn_m1.json").read_text())
    m1024 = json.loads((bench_dir / "step_ab_h200_all_modes_m1024.json").read_text())
    m1024 = m1024["workloads"]["attn"]
    estimates = []
    for kernels, host, step, quack_mode in (
            (m1["kernels"], {k: v["host_us"] for k, v in m1["timed"].items()},
             {k: v["step_us"] for k, v in m1["timed"].items()}, "predicted"),
            (m1024["kernels"], m1024["host_us"], m1024["step_us"], "reduced")):
        gemms = kernels["default"]["aten"]
        assert kernels["default"]["quack"] == 0 and kernels[quack_mode]["quack"] == 2
        estimates.append(host["default"] / gemms + (step[quack_mode] - step["default"]) / 2)
    assert abs(max(estimates) - QUACK_LAUNCH_HOST_US) < 0.5, estimates


def test_library_launch_costs_in_the_committed_probes():
    """What QUACK_LAUNCH_HOST_US's comment says of quack launched from its TVM-FFI library,
    from both H200 runs of scripts/launch_probe.py (since removed: docs/reproduce.md):
    in a compiled single-GEMM graph it costs the host -0.5 to +5.6 us against ATen's extern
    call and 9-12 us more than a Triton template; every call ran from the library; quack's GPU
    gain over cuBLAS is at most 2.4 us."""
    deltas, gaps, gains = [], [], []
    for name in ("launch_probe_h200.json.gz", "launch_probe_h200_r2.json.gz"):
        res = json.loads(gzip.decompress((REPO / "data" / "bench" / name).read_bytes()))
        assert res["build"]["failed"] == 0
        rows = [r for r in res["compiled"] if "round" in r]
        for m in {r["m"] for r in rows}:
            step = {mode: sorted(r["median"] * 1e3 for r in rows
                                 if r["m"] == m and r["mode"] == mode)[1]
                    for mode in ("default", "max-autotune-triton", "predicted-quack")}
            deltas.append(step["predicted-quack"] - step["default"])
            gaps.append(step["predicted-quack"] - step["max-autotune-triton"])
        for path in res["paths"]:
            assert all(q["via"] == "library" for q in path["quack"])
            best = min(q["time_us"] for q in path["quack"])
            gains.append(path["aten"]["time_us"] - best)
    assert len(deltas) == 4
    assert -0.6 < min(deltas) and max(deltas) < 5.7, deltas
    assert 9.0 < min(gaps) and max(gaps) < 12.5, gaps
    assert max(gains) < 2.5, gains


def _step_ab():
    return _script("step_ab")


def test_step_targets_from_one_process_results():
    ab = _step_ab()

    def part(m, **step_us):
        return {"m": m, "workloads": {"mlp": {"step_us": step_us}}}

    parts = [part(16, default=100.0, **{"max-autotune": 90.0}, predicted=90.5, reduced=92.0),
             part(1024, default=500.0, **{"max-autotune": 505.0}, predicted=480.0,
                  reduced=480.0),
             part(4096, default=2000.0, predicted=1950.0)]  # max-autotune not run: best = default
    t = ab.step_targets(parts)["mlp"]
    assert t["predicted_step_over_best_ratio"]["by_m"] == {16: 90.5 / 90.0, 1024: 0.96,
                                                           4096: 0.975}
    assert t["predicted_step_over_best_ratio"]["met"] is True
    assert t["reduced_step_over_predicted_ratio"]["by_m"] == {16: 92.0 / 90.5, 1024: 1.0}
    assert t["reduced_step_over_predicted_ratio"]["met"] is False  # 1.7 % over at M=16
    big = t["predicted_step_geomean_m_ge_1024_over_best"]
    assert big["checked"] == 2 and big["met"] is True
    assert abs(big["value"] - (0.96 * 0.975) ** 0.5) < 1e-12
    with pytest.raises(ValueError, match=r"M \[16\] more than once"):
        ab.step_targets([*parts, part(16, default=100.0, predicted=130.0)])


def test_step_targets_hold_predicted_variants_to_its_limit():
    """predicted-unfused and predicted-heldout, where a result has them, get their own ratio
    to the better of default and max-autotune; absent ones no entry."""
    ab = _step_ab()
    parts = [{"m": 1, "workloads": {"mlp": {"step_us": {
        "default": 100.0, "max-autotune": 98.0, "predicted": 101.0,
        "predicted-unfused": 97.0}}}}]
    t = ab.step_targets(parts)["mlp"]
    assert t["predicted_unfused_step_over_best_ratio"]["by_m"] == {1: 97.0 / 98.0}
    assert t["predicted_unfused_step_over_best_ratio"]["met"] is True
    assert t["predicted_step_over_best_ratio"]["met"] is False
    assert "predicted_heldout_step_over_best_ratio" not in t


def test_step_timing_pins_to_one_cpu_and_restores():
    """--pin-cpu: the timing thread runs on the given CPU alone and gets its CPUs back after;
    a CPU the process may not use is named in the error."""
    import os

    allowed = os.sched_getaffinity(0)
    cpu = max(allowed)
    with benchlib.pinned(cpu):
        assert os.sched_getaffinity(0) == {cpu}
    assert os.sched_getaffinity(0) == allowed
    with benchlib.pinned(None):
        assert os.sched_getaffinity(0) == allowed
    with pytest.raises(ValueError, match=f"cannot pin to CPU {max(allowed) + 1}"):
        with benchlib.pinned(max(allowed) + 1):
            pass
    assert os.sched_getaffinity(0) == allowed


def test_step_timing_pauses_the_garbage_collector_and_restores_it():
    """--gc-off: no collection while timing (the collector off, young objects collected
    first); the collector as it was after, also where the caller had it off."""
    import gc

    ab = _step_ab()
    assert gc.isenabled()
    with ab._gc_paused(True):
        assert not gc.isenabled() and gc.get_count()[0] < 50
    assert gc.isenabled()
    with ab._gc_paused(False):
        assert gc.isenabled()
    gc.disable()
    try:
        with ab._gc_paused(True):
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_cpu_samples_count_steal_apart_from_busy(monkeypatch):
    """The machine's steal time (fields 8 of /proc/stat's cpu line) is its own figure, not
    busy time."""
    a = {"t": 0.0, "threads": {}, "busy": 100, "total": 1000, "steal": 10}
    b = {"t": 1.0, "threads": {}, "busy": 100 + 50, "total": 2000, "steal": 10 + 25}
    monkeypatch.setattr(benchlib.os, "sysconf", lambda name: 100)
    assert benchlib.cpu_during(a, b) == {"threads": {}, "machine_busy_cores": 0.5,
                                           "steal_cores": 0.25}
    sample = benchlib.cpu_sample()
    if sample is not None:  # Linux
        assert sample["busy"] + sample["steal"] <= sample["total"]


def test_modes_compiled_again_when_timed_do_not_count():
    ab = _step_ab()
    wl = {"step_us": {"default": 100.0, "max-autotune": 90.0, "predicted": 99.0,
                      "reduced": 91.0},
          "graphs_compiled_when_timed": {"default": 0, "max-autotune": 0, "predicted": 1,
                                         "reduced": 0}}
    assert ab.counted_steps(wl) == {"default": 100.0, "max-autotune": 90.0, "reduced": 91.0}
    assert ab.counted_steps(wl, {"reduced"}) == {"default": 100.0, "max-autotune": 90.0}
    t = ab.step_targets([{"m": 16, "workloads": {"mlp": wl}}])["mlp"]
    assert t["predicted_step_over_best_ratio"]["checked"] == 0


def test_capturing_code_keeps_the_modes_compiled_before():
    """Each mode's compile must survive the next one's: Inductor's run_and_get_code resets
    Dynamo, so a step compiled before would compile again when timed, without cutetune."""
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    first = torch.compile(benchlib.fresh_step(torch.sin), backend="eager")
    second = torch.compile(benchlib.fresh_step(torch.cos), backend="eager")
    x = torch.ones(3)
    benchlib.run_and_capture_code(first, x)
    benchlib.run_and_capture_code(second, x)
    graphs = counters["stats"]["unique_graphs"]
    first(x)
    second(x)
    assert counters["stats"]["unique_graphs"] == graphs


def test_each_compiled_step_gets_its_own_code_object():
    first, second = benchlib.fresh_step(len), benchlib.fresh_step(len)
    assert first.__code__ is not second.__code__ and first("abc") == second("abc") == 3


def test_cpu_during_timing_names_the_busy_thread():
    import time

    before = benchlib.cpu_sample()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.3:  # this thread spins
        pass
    cpu = benchlib.cpu_during(before, benchlib.cpu_sample())
    assert max(cpu["threads"].values()) > 0.3 and cpu["machine_busy_cores"] > 0.3
    assert benchlib.cpu_during(None, before) is None  # off Linux: nothing sampled


FIRST_IMPORT = """
import importlib.util, json, os, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))  # benchlib, as for a script run
spec = importlib.util.spec_from_file_location("bench_e2e", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
seen = bench.watch_first_import("colorsys")


def culprit():
    import colorsys  # noqa: F401


culprit()
import colorsys  # noqa: E402,F401  (imported already: not recorded again)
print(json.dumps(seen))
"""


def test_the_first_import_of_a_module_names_its_importer(run_script):
    """The benchmark names where quack was first imported (``quack_imported_by``): here the
    function whose import statement loaded the module, not a later import of it."""
    by = run_script(FIRST_IMPORT, REPO / "scripts" / "bench_e2e.py")["by"]
    assert by[-1].endswith(" culprit") and "script" in by[-1], by


def test_step_dynamic_reports_predicted_over_the_better_baseline():
    res = _script("step_dynamic").over_best({"16": {"default": 10.0, "max-autotune": 8.0, "predicted": 9.0},
                                  "1024": {"default": 100.0, "predicted": 95.0},
                                  "4096": {"default": 400.0, "max-autotune": 410.0,
                                           "predicted": 380.0}})
    assert res["by_m"] == {"16": 9.0 / 8.0, "1024": 0.95, "4096": 0.95}
    assert res["geomean_m_ge_1024"] == pytest.approx(0.95)
    assert "reduced_over_predicted" not in res
    res = _script("step_dynamic").over_best({"16": {"default": 10.0, "predicted": 9.0,
                                                    "reduced": 9.9}})
    assert res["reduced_over_predicted"] == {"16": pytest.approx(1.1)}


def test_rounds_pair_runs_of_one_round_and_check_the_median():
    """--rounds: a check compares the runs of one round and takes the median over rounds; a
    round without one side leaves that round out; merging keeps the rounds apart."""
    def run(mode, cache, rnd, compile_s, status="ok"):
        wl = {"compile_s": compile_s, "step_ms": 0.1}
        return {"mode": mode, "m": 1, "kernel_cache": cache, "round": rnd, "status": status,
                "workloads": {"mlp": wl, "attn": wl}}

    runs = [run("default", None, 0, 8.0), run("predicted", "cold", 0, 11.0),
            run("default", None, 1, 12.0), run("predicted", "cold", 1, 11.0),
            run("default", None, 2, 9.0), run("predicted", "cold", 2, 10.0),
            run("default", None, 3, 9.0), run("predicted", "cold", 3, 0.0, "skipped")]
    res = {"meta": {"ms": [1]}, "runs": runs}
    check = bench.targets(res)["mlp"]["predicted_compile_cold_over_default_s"]
    assert check["by_m_rounds"] == {1: [3.0, -1.0, 1.0]}
    assert check["by_m"] == {1: 1.0} and check["met"] is True
    assert bench._values(res, "mlp", "compile_s")("default", 1) == 9.0  # median of 4 rounds
    merged = bench.merge([_part(runs[:4]), _part(runs[4:])])
    assert len(merged["runs"]) == len(runs)
    one_round = bench.targets({"meta": {"ms": [1]}, "runs": runs[:2]})["mlp"]
    assert "by_m_rounds" not in one_round["predicted_compile_cold_over_default_s"]


def test_compile_phases_are_those_since_dynamos_reset():
    """The worker reads them after run_and_get_code, which resets Dynamo before compiling."""
    import torch
    from torch._inductor.utils import run_and_get_code

    from torch._dynamo.utils import compilation_time_metrics

    for fn in (torch.sin, torch.cos):
        run_and_get_code(torch.compile(lambda x, fn=fn: fn(x) + 1, backend="eager"),
                         torch.ones(3))
        assert len(compilation_time_metrics["_compile.compile_inner"]) == 1  # this compile's
        assert bench._compile_phases(floor_s=0.0)["_compile.compile_inner"] > 0
    torch._dynamo.reset()
    assert "_compile.compile_inner" not in bench._compile_phases(floor_s=0.0)


@pytest.mark.parametrize("name, runs", [("e2e_h200_1gpu_rounds.json.gz", 18),
                                        ("e2e_h200_1gpu_rounds_r2.json.gz", 18),
                                        ("e2e_h200_1gpu_rounds128.json.gz", 8)])
def test_committed_rounds_results_follow_from_their_runs(name, runs):
    res = json.loads(gzip.decompress((REPO / "data" / "bench" / name).read_bytes()))
    ok = [r for r in res["runs"] if r["status"] == "ok"]
    assert {r["round"] for r in ok} == {0, 1, 2} and len(ok) == runs
    assert res["targets"] == json.loads(json.dumps(bench.targets(res)))
    assert res["compile_split_s"] == json.loads(json.dumps(bench.compile_split(res)))
    assert all(w["rel_err"] < 1e-2 for r in ok for w in r["workloads"].values())
