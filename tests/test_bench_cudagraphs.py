"""scripts/bench_cudagraphs.py on the CPU: its workload's shapes and graph, the result rows in
the issue's form, the targets and the host-cost verdict computed from them, and the budget."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from test_bench_e2e import _script

benchlib = sys.modules["benchlib"]
bench = sys.modules["bench_cudagraphs"] = _script("bench_cudagraphs")  # Dynamo imports it


def stats(median):
    return {"median": median, "p20": median * 0.99, "p80": median * 1.01}


def measured(m, graphs: dict, plain: dict, status="ok", again=None):
    return {"m": m, "status": status, "cudagraphs": {k: stats(v) for k, v in graphs.items()},
            "no_cudagraphs": {k: stats(v) for k, v in plain.items()},
            "graphs_compiled_when_timed": again or {}}


def test_the_decoder_stack_is_one_graph_with_every_gemm_of_a_layer():
    """Dynamo traces the stack whole (no graph break: its GEMMs share one compiled step) and
    finds each layer's seven projections, SDPA among them; shapes on the meta device."""
    with torch.device("meta"):
        stack = bench.decoder_stack(torch, 2)
        assert stack(torch.empty(16, benchlib.HIDDEN)).shape == (16, benchlib.HIDDEN)
    linear = [m for m in stack.modules() if isinstance(m, torch.nn.Linear)]
    assert sorted((m.out_features, m.in_features) for m in linear[:7]) == sorted([
        (4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096), (14336, 4096),
        (14336, 4096), (4096, 14336)])
    assert len(linear) == 14
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    one = bench.decoder_stack(torch, 1).eval()
    with torch.no_grad():
        torch.compile(one, backend=backend)(torch.randn(2, benchlib.HIDDEN))
    (gm,) = graphs
    assert "scaled_dot_product_attention" in gm.code
    torch._dynamo.reset()


def test_rows_are_in_the_issues_form_and_the_targets_follow_from_them():
    meta = {"complete": True}
    res = bench.report(meta, [
        measured(16, {"default": 200.0, "max-autotune": 180.0, "predicted": 181.0,
                      "reduced": 181.5},
                 {"default": 250.0, "max-autotune": 260.0, "predicted": 240.0, "reduced": 245.0,
                  "predicted-gputime": 248.0, "reduced-gputime": 240.0}),
        measured(1, {"default": 300.0, "max-autotune": 280.0, "predicted": 290.0,
                     "reduced": 280.0},
                 {"default": 320.0, "max-autotune": 330.0, "predicted": 318.0, "reduced": 319.0,
                  "predicted-gputime": 317.0, "reduced-gputime": 321.0}),
        {"m": 4, "status": "skipped", "reason": "budget: ~90 s needed, 10 s left"}])
    json.dumps(res)
    rows = res["cudagraphs"]
    assert [r["m"] for r in rows] == [1, 4, 16]
    assert rows[0]["step_us"]["predicted"] == stats(290.0)
    assert rows[0]["ratio_predicted_over_best"] == pytest.approx(290 / 280, abs=1e-4)
    assert rows[2]["ratio_predicted_over_best"] == pytest.approx(181 / 180, abs=1e-4)
    assert rows[1]["ratio_predicted_over_best"] is None and rows[1]["status"] == "skipped"
    checks = res["targets"]["predicted_step_over_best_ratio"]
    assert checks["checked"] == 2 and checks["met"] is False  # 1.036 at M=1
    assert res["targets"]["reduced_step_over_predicted_ratio"]["met"] is True
    plain = res["no_cudagraphs"]
    assert plain[0]["ratio_predicted_gputime_over_best"] == pytest.approx(317 / 320, abs=1e-4)
    verdict = res["host_cost_machinery"]
    assert verdict["predicted"] == {"ms": [1, 16], "with_host_cost_us": 558.0,
                                    "gpu_time_only_us": 565.0, "pays": True}
    assert verdict["reduced"] == {"ms": [1, 16], "with_host_cost_us": 564.0,
                                  "gpu_time_only_us": 561.0, "pays": False}


def test_a_mode_compiled_again_when_timed_does_not_count():
    r = bench.result_row(measured(1, {"default": 300.0, "max-autotune": 250.0,
                                      "predicted": 290.0}, {},
                                  again={"cudagraphs/max-autotune": 1}), "cudagraphs")
    assert "max-autotune" not in r["step_us"]
    assert r["ratio_predicted_over_best"] == pytest.approx(290 / 300, abs=1e-4)


def test_step_stats_pool_the_batches_in_us():
    s = bench.step_stats({"a": [0.1, 0.2, 0.3, 0.4, 0.5]})
    assert s == {"a": {"median": 300.0, "p20": 180.0, "p80": 420.0}}


def test_the_budget_takes_the_longest_m_so_far():
    assert bench.plan(0.0, 470.0, [])[0]  # the first guess fits a fresh budget
    fits, why = bench.plan(400.0, 470.0, [60.0, 80.0])
    assert not fits and why == "~80 s needed, 70 s left"
    assert bench.plan(300.0, 470.0, [60.0, 80.0])[0]


def test_resume_keeps_the_completed_ms_and_runs_the_rest(tmp_path, capsys):
    earlier = bench.report({"argv": ["--ms", "1", "16"]}, [
        measured(1, {"default": 300.0, "predicted": 290.0}, {"default": 320.0}),
        {"m": 16, "status": "skipped", "reason": "budget"}])
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(earlier))
    kept, metas = bench.resumed([path])
    assert [r["m"] for r in kept] == [1] and metas == [{"argv": ["--ms", "1", "16"]}]
    assert bench.main(["--plan", "--resume", str(path), "--ms", "1", "16", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["ms"] == [16, 4]
    assert bench.main(["--plan", "--resume", str(path), "--ms", "1", "16", "--rerun", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["ms"] == [1, 16]  # timed again
    assert bench.resumed(None) == ([], [])
    path.write_text('{"meta": {}}')
    with pytest.raises(SystemExit, match="not a bench_cudagraphs.py result file"):
        bench.resumed([path])


def test_merge_only_joins_calls_without_a_gpu_the_later_file_winning(tmp_path, capsys):
    first, second, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "all.json"
    first.write_text(json.dumps(bench.report({"call": 1}, [
        measured(1, {"default": 300.0, "max-autotune": 280.0, "predicted": 290.0}, {}),
        measured(16, {"default": 200.0, "max-autotune": 210.0, "predicted": 199.0}, {})])))
    second.write_text(json.dumps(bench.report({"call": 2}, [
        measured(1, {"default": 300.0, "max-autotune": 280.0, "predicted": 281.0}, {})])))
    assert bench.main(["--merge-only", "--resume", str(first), str(second), "--ms", "1", "16",
                       "4", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert [(r["m"], r["status"]) for r in res["cudagraphs"]] == [(1, "ok"), (4, "skipped"),
                                                                  (16, "ok")]
    assert res["cudagraphs"][0]["ratio_predicted_over_best"] == round(281.0 / 280.0, 4)
    assert res["meta"]["merged"] == [{"call": 1}, {"call": 2}] and not res["meta"]["complete"]
    assert res["targets"]["predicted_step_over_best_ratio"]["checked"] == 2
    assert bench.main(["--merge-only", "--resume", str(first), "--ms", "16", "--out",
                       str(out)]) == 0  # the files' Ms of --ms only
    merged = json.loads(out.read_text())
    assert [r["m"] for r in merged["cudagraphs"]] == [16] and merged["meta"]["complete"]
    packed = tmp_path / "all.json.gz"  # gzipped where the name says so, and resumed from
    assert bench.main(["--merge-only", "--resume", str(out), "--ms", "16", "--out",
                       str(packed)]) == 0
    assert [r["m"] for r in bench.resumed([packed])[0]] == [16]


def test_gputime_variants_compile_with_the_host_cost_rules_off():
    from cutetune.tuner.inductor import decisions as idec

    with bench.installation("predicted-gputime"):
        assert idec.host_bound_us() == 0.0
    assert idec.host_bound_us() == idec.QUACK_LAUNCH_HOST_US
    assert list(bench.groups()) == ["no_cudagraphs", "cudagraphs"]
    assert set(bench.GPUTIME) <= set(bench.groups()["no_cudagraphs"])


def test_cuda_graph_compiles_as_reduce_overhead_does(monkeypatch):
    """compiled_step: cudagraphs as mode="reduce-overhead" sets them, max-autotune as
    mode="max-autotune" (which also tunes pointwise kernels)."""
    import torch._inductor as ti

    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, options=None: seen.append(options))
    for mode in ("default", "max-autotune"):
        benchlib.compiled_step(torch.nn.Identity(), mode, cuda_graphs=True)
    assert seen[0] == ti.list_mode_options("reduce-overhead")
    assert {k: v for k, v in seen[1].items() if k != "max_autotune_gemm_backends"} == \
        ti.list_mode_options("max-autotune")
    benchlib.compiled_step(torch.nn.Identity(), "default")
    assert seen[2] is None
