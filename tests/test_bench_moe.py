"""scripts/bench_moe.py's MoE block on the CPU: compiled forward and backward with a dynamic
token count match eager, its fp32 reference agrees with torch._grouped_mm's routing, the
router's spread is measured, and a run's results plot."""

import json

import pytest
import torch

from cutetune.space.suites import MoeLayer
from test_bench_e2e import _script  # loads the scripts' benchlib first

bench = _script("bench_moe")

TINY = MoeLayer(experts=4, top_k=2, hidden=32, intermediate=16)


def _grouped(a, b, offs):
    return torch._grouped_mm(a, b, offs=offs)


def test_the_block_compiles_once_for_every_token_count_and_matches_eager():
    torch.manual_seed(0)
    module = bench.moe_block(torch, TINY, _grouped, device="cpu")
    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    step = bench.block_step(torch, module, "default", train=True)
    eager = bench.block_step(torch, module, "eager", train=True)
    for tokens in (16, 40):
        x = torch.randn(tokens, TINY.hidden, dtype=torch.bfloat16)
        torch._dynamo.maybe_mark_dynamic(x, 0)
        gy = torch.randn_like(x)
        y = step(x, gy)
        grads = [p.grad.clone() for p in module.parameters()]
        y_eager = eager(x, gy)
        torch.testing.assert_close(y, y_eager, atol=2e-2, rtol=2e-2)
        for got, ref in zip(grads, (p.grad for p in module.parameters())):
            torch.testing.assert_close(got, ref, atol=5e-2, rtol=5e-2)
        assert bench.rel_err_fp32(torch, module, x, y) < 2e-2
    # one graph for both token counts: no recompile
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 1


def test_the_routing_spread_is_the_routers():
    """The block's router of random weights spreads rows near evenly; one that sends every
    token to the same experts leaves the others empty."""
    torch.manual_seed(0)
    layer = MoeLayer(experts=16, top_k=2, hidden=64, intermediate=16)
    module = bench.moe_block(torch, layer, _grouped, device="cpu", dtype=torch.float32)
    x = torch.randn(4096, layer.hidden)
    even = bench.routing_spread(torch, module, layer, x)
    assert even["empty_share"] == 0 and even["max_over_mean"] < 1.5 and even["cv"] < 0.3
    with torch.no_grad():
        module.router.weight.zero_()
        module.router.weight[:2] = 1.0
    one = bench.routing_spread(torch, module, layer, x.abs())
    assert one == {"max_over_mean": 8.0, "cv": one["cv"], "empty_share": 14 / 16}


def test_the_plot_draws_each_model_and_phase_of_a_run(tmp_path):
    """A run's block file, a mode that failed among them, as one figure."""
    def rows(scale):
        return [{"tokens": t, "step_ms": {"median": scale * t, "p20": scale * t * 0.9,
                                          "p80": scale * t * 1.1}} for t in (128, 1024)]

    blocks = [{"model": m, "mode": mode,
               "phases": {p: {"rows": rows(s)} for p in ("fwd", "train")}}
              for m in ("a", "b") for mode, s in (("default", 1.0), ("predicted", 0.8))]
    blocks.append({"model": "a", "mode": "reduced", "error": "out of time"})
    path = tmp_path / "moe_block_h200.json"
    path.write_text(json.dumps({"blocks": blocks}))
    bench.plot(str(path), str(tmp_path / "out.png"))
    assert (tmp_path / "out.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    path.write_text(json.dumps({"blocks": blocks[-1:]}))
    with pytest.raises(ValueError, match="holds no block that ran"):
        bench.plot(str(path), str(tmp_path / "none.png"))
