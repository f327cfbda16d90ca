"""scripts/bench_train_step.py on the CPU: the flash-shaped stack computes what the benchmark of
small M computes, a step leaves each weight's gradient of that step alone, and the arguments."""

from __future__ import annotations

import sys

import pytest
import torch

from test_bench_e2e import _script

benchlib = sys.modules["benchlib"]
stack_module = sys.modules.setdefault("bench_cudagraphs", _script("bench_cudagraphs"))
bench = _script("bench_train_step")


@pytest.fixture
def small_stack(monkeypatch):
    """The decoder stack at a width the CPU runs in a moment (4 query heads, 2 KV heads)."""
    for name, value in (("HIDDEN", 512), ("KV", 256), ("INTER", 1024)):
        monkeypatch.setattr(stack_module, name, value)
    return lambda flash: stack_module.decoder_stack(torch, 2, flash=flash)


def test_the_flash_shaped_stack_computes_what_the_grouped_heads_compute(small_stack):
    x = torch.randn(6, 512)
    torch.manual_seed(0)
    grouped = small_stack(False)
    torch.manual_seed(0)
    flash = small_stack(True)
    torch.testing.assert_close(flash(x), grouped(x))


def test_a_step_leaves_that_steps_gradients_not_a_sum(small_stack):
    module = small_stack(True)
    step = bench.train_step(module, module)
    x = torch.randn(6, 512)
    loss = step(x)
    first = bench.grads(module)
    assert loss.item() > 0 and len(first) == 14  # seven projections a layer, not the norms
    step(x)
    for name, g in bench.grads(module).items():
        torch.testing.assert_close(g, first[name])


def test_the_ratios_need_the_default_mode(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--modes", "predicted", "--plan"])
    assert bench.main(["--plan"]) == 0
    assert '"m": 4096' in capsys.readouterr().out
