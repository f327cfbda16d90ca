"""scripts/score_models.py replays the shipped models on the committed H100 measurements of
shapes neither trained on, and finds the figures the README quotes."""

from __future__ import annotations

import gzip
import json

import pytest

from test_bench_e2e import REPO, _script

UNSEEN = REPO / "data" / "bench" / "h100_bf16_unseen"
COMMITTED = REPO / "data" / "reports" / "models_on_h100_unseen.json.gz"


@pytest.mark.skipif(not UNSEEN.is_dir(), reason="no H100 unseen dataset in this checkout")
def test_the_h100s_model_beats_the_h200s_on_the_h100s_unseen_shapes(tmp_path):
    out = tmp_path / "score.json"
    h100 = REPO / "cutetune" / "data" / "h100_sxm" / "cost_model_sm90_bf16.json.gz"
    assert _script("score_models").main([str(UNSEEN), "--model", f"h100={h100}",
                                         "--model", "h200=shipped", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    committed = json.load(gzip.open(COMMITTED))
    assert got["problems"] == committed["problems"] == 371
    for name in ("h100", "h200"):
        mine, theirs = (r["models"][name]["summary"] for r in (got, committed))
        assert mine["model"] == pytest.approx(theirs["model"], rel=1e-9)
        assert mine["model_top1_vs_best"] == pytest.approx(theirs["model_top1_vs_best"], rel=1e-9)
    h100_s, h200_s = (got["models"][n]["summary"]["model"] for n in ("h100", "h200"))
    assert h100_s["decision_vs_cublas"] > h200_s["decision_vs_cublas"] > 1.0
    assert got["first_over_second"]["first_faster"] > got["first_over_second"]["second_faster"]
