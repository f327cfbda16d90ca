"""``cutetune.grouped_mm`` on a real GPU: quack's varlen kernels in the three MoE forms against
fp32, autograd, CUDA graphs, and predicted mode in torch.compile with the shipped model. Run on
the H200 with `pytest -m gpu`."""

import pytest

from cutetune.space.enumerate import enumerate_configs

pytestmark = pytest.mark.gpu

COUNTS = (300, 0, 1, 723, 64, 128, 0, 832)  # ragged, one row, two empty experts
N, K = 1024, 2048


class FirstValid:
    """A grouped model that picks the first valid config of every problem, never ATen."""

    def rank(self, problem, top_k=None):
        return [(enumerate_configs(problem.arch, problem)[0], 1.0)]

    def picks(self, problems):
        return [self.rank(p)[0][0] for p in problems]


@pytest.fixture
def torch_gpu():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from cutetune.tuner.kernels import grouped_mm

    grouped_mm.set_model(FirstValid())
    yield torch
    grouped_mm.set_model(None)


def _operands(torch, requires_grad=False):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(sum(COUNTS), K, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(len(COUNTS), N, K, device="cuda", dtype=torch.bfloat16, generator=g)
    offs = torch.tensor(COUNTS, device="cuda").cumsum(0).to(torch.int32)
    return x.requires_grad_(requires_grad), w.requires_grad_(requires_grad), offs


def _rel(torch, got, ref):
    return float(torch.linalg.vector_norm(got.float() - ref) / torch.linalg.vector_norm(ref))


def _reference(torch, a, b, offs):
    """fp32 per-expert products in torch._grouped_mm's forms."""
    bounds = [0, *offs.tolist()]
    if b.dim() == 3:
        return torch.cat([a[lo:hi].float() @ b[e].float()
                          for e, (lo, hi) in enumerate(zip(bounds, bounds[1:]))])
    return torch.stack([a[:, lo:hi].float() @ b[lo:hi].float()
                        for lo, hi in zip(bounds, bounds[1:])])


def test_the_three_forms_run_quack_and_match_fp32(torch_gpu):
    torch = torch_gpu
    from cutetune.tuner.kernels import grouped_mm

    x, w, offs = _operands(torch)
    dy = torch.randn(sum(COUNTS), N, device="cuda", dtype=torch.bfloat16)
    for a, b in ((x, w.mT), (dy, w), (dy.mT, x)):  # fwd, dgrad, wgrad
        out = grouped_mm.grouped_mm(a, b, offs)
        assert grouped_mm.launched_via(a, b, offs) == "quack"
        ref = _reference(torch, a, b, offs)
        assert _rel(torch, out, ref) < 1e-2
        assert _rel(torch, torch._grouped_mm(a, b, offs=offs), ref) < 1e-2


def test_autograd_runs_the_gradients_as_grouped_gemms(torch_gpu):
    torch = torch_gpu
    import cutetune

    x, w, offs = _operands(torch, requires_grad=True)
    dy = torch.randn(sum(COUNTS), N, device="cuda", dtype=torch.bfloat16)
    y = cutetune.grouped_mm(x, w.mT, offs)
    y.backward(dy)
    xr, wr = (t.detach().float().requires_grad_() for t in (x, w))
    bounds = [0, *offs.tolist()]
    yr = torch.cat([xr[lo:hi] @ wr[e].T for e, (lo, hi) in enumerate(zip(bounds, bounds[1:]))])
    yr.backward(dy.float())
    assert _rel(torch, y, yr.detach()) < 1e-2
    assert _rel(torch, x.grad, xr.grad) < 1e-2
    assert _rel(torch, w.grad, wr.grad) < 1e-2


def test_a_cuda_graph_replays_the_kernel(torch_gpu):
    torch = torch_gpu
    from cutetune.tuner.kernels import grouped_mm

    x, w, offs = _operands(torch)
    grouped_mm.grouped_mm(x, w.mT, offs)  # the first launch compiles, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = grouped_mm.grouped_mm(x, w.mT, offs)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert grouped_mm.launched_via(x, w.mT, offs) == "quack"
    assert _rel(torch, out, _reference(torch, x, w.mT, offs)) < 1e-2


def test_predicted_mode_with_the_shipped_model_compiles_forward_and_backward(torch_gpu):
    """aten._grouped_mm in a compiled MoE-like function, a dynamic token count: the graphs
    get the shipped model's tables (quack for the ranges it picks) and match eager."""
    torch = torch_gpu
    from cutetune.tuner.inductor.install import enable
    from cutetune.tuner.kernels import grouped_mm
    from torch._inductor.utils import run_and_get_code

    grouped_mm.set_model(None)
    torch._dynamo.reset()

    def expert_mlp(x, w1, w2, offs):
        h = torch._grouped_mm(x, w1.mT, offs=offs)
        return torch._grouped_mm(torch.relu(h), w2.mT, offs=offs)

    x, w1, offs = _operands(torch, requires_grad=True)
    w2 = torch.randn(len(COUNTS), K, N, device="cuda", dtype=torch.bfloat16,
                     requires_grad=True)
    torch._dynamo.mark_dynamic(x, 0)
    with enable("predicted"):
        compiled = torch.compile(expert_mlp)
        y, codes = run_and_get_code(lambda: compiled(x, w1, w2, offs))
        y.backward(torch.ones_like(y))
    quack_picked = any(c is not None for c in grouped_mm.picker().picks_.values())
    assert any(grouped_mm.GROUPED_MM_KERNEL in c for c in codes) == quack_picked
    # the compile handed the picked kernels to the compile helper; once built, calls run them
    from cutetune.tuner.kernels.helper import shared_prefetcher

    assert shared_prefetcher("sm90").wait(timeout=300)["failed"] == 0
    with enable("predicted"):
        compiled(x, w1, w2, offs)
    assert any(p.via == "quack" for p in grouped_mm._plans.values()) == quack_picked
    grads = x.grad, w1.grad, w2.grad
    xe, w1e, w2e = (t.detach().clone().requires_grad_() for t in (x, w1, w2))
    ye = expert_mlp(xe, w1e, w2e, offs)
    ye.backward(torch.ones_like(ye))
    assert _rel(torch, y, ye.detach().float()) < 1e-2
    for got, ref in zip(grads, (xe.grad, w1e.grad, w2e.grad)):
        assert _rel(torch, got, ref.float()) < 2e-2


def test_reduced_mode_benchmarks_quack_beside_inductors_grouped_templates(torch_gpu, caplog):
    """A static token count in reduced mode: Inductor's grouped lowering benchmarks ATen, its
    Triton templates and the shipped model's top-k quack kernels (built by the compile
    helper), and the compiled forward and backward match eager."""
    torch = torch_gpu
    from cutetune.tuner.inductor.install import enable
    from cutetune.tuner.kernels import grouped_mm

    grouped_mm.set_model(None)
    torch._dynamo.reset()
    x, w, offs = _operands(torch, requires_grad=True)
    dy = torch.randn(sum(COUNTS), N, device="cuda", dtype=torch.bfloat16)
    with enable("reduced", top_k=3), caplog.at_level("INFO", logger="cutetune.tuner.inductor"):
        compiled = torch.compile(lambda x, w, offs: torch._grouped_mm(x, w.mT, offs=offs))
        y = compiled(x, w, offs)
        y.backward(dy)
    assert caplog.text.count("among Inductor's candidates") == 3  # fwd, dgrad, wgrad
    grads = x.grad, w.grad
    xe, we = (t.detach().clone().requires_grad_() for t in (x, w))
    ye = torch._grouped_mm(xe, we.mT, offs=offs)
    ye.backward(dy)
    assert _rel(torch, y, ye.detach().float()) < 1e-2
    for got, ref in zip(grads, (xe.grad, we.grad)):
        assert _rel(torch, got, ref.float()) < 2e-2
