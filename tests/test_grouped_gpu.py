"""The grouped (MoE) measurement harness on a real GPU: quack's varlen-M and varlen-K kernels
and torch._grouped_mm on routed rows, checked against fp32 with an empty expert among them.
Run on the H200 with `pytest -m gpu`."""

import json

import pytest

from cutetune.space.enumerate import enumerate_configs
from cutetune.space.problem import GroupedProblem

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu_worker(tmp_path_factory):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from cutetune.tuner.measure.timing import init_gpu_worker

    init_gpu_worker(str(tmp_path_factory.mktemp("quack-cache")))


@pytest.mark.parametrize("gemm", ["fwd", "dgrad", "wgrad"])
def test_grouped_quack_and_aten_are_measured_correctly(gpu_worker, gemm):
    from cutetune.tuner.measure.grouped import ATEN_BACKEND, measure_grouped
    from cutetune.tuner.measure.timing import MeasureTask

    counts = (300, 0, 1, 723, 64, 128, 0, 832)  # ragged, one row, two empty experts
    total = sum(counts)
    sizes = dict(m=total, n=1024, k=2048) if gemm != "wgrad" else dict(m=1024, n=2048, k=total)
    p = GroupedProblem(experts=len(counts), gemm=gemm, **sizes)
    configs = tuple(enumerate_configs("sm90", p)[:2])
    assert configs
    rows = measure_grouped(MeasureTask(p, "test", configs, cublas=True, counts=counts))
    assert [r["backend"] for r in rows] == [ATEN_BACKEND, "quack", "quack"]
    for r in rows:
        assert r["status"] == "ok", r
        assert r["rel_err"] < 1e-2
        assert 0 < r["time_ms_p20"] <= r["time_ms"] <= r["time_ms_p80"] < 10
        assert json.loads(r["expert_counts"]) == list(counts)
        assert r["problem_key"] == p.key()


def test_a_grouped_kernel_that_skips_an_expert_is_caught(gpu_worker):
    """The poison check covers every expert's rows: a kernel told of one expert fewer leaves
    the last expert's rows unwritten, and the row says wrong_result."""
    from cutetune.tuner.kernels.quack_gemm import grouped_kernel
    from cutetune.tuner.measure.grouped import _buffers
    from cutetune.tuner.measure.timing import MeasureTask, TimingPolicy, _row, timed_outcome

    counts = (256, 256, 256, 256)
    p = GroupedProblem(experts=4, m=1024, n=512, k=512)
    config = enumerate_configs("sm90", p)[0]
    kernel = grouped_kernel(config, "sm90", "m")
    buf = _buffers(p, counts)

    def short(a, b, d, cu, offs):
        kernel(a[:768], b[:3], d[:768], cu[:4])

    row = _row(MeasureTask(p, "test", ()), "quack", config,
               **timed_outcome(short, buf, TimingPolicy()))
    assert row["status"] == "wrong_result"


def test_a_varlen_m_kernel_gathers_its_rows_through_an_index(gpu_worker):
    """quack's gather (``A_idx``), as bench_moe.py's copy-free up projection runs it: row i
    of the product is row idx[i] of A (each token's row taken twice, in expert order) times
    its expert's B, against the fp32 reference of the copied rows."""
    import torch

    from cutetune.tuner.kernels.quack_gemm import MmPlan, launch
    from cutetune.tuner.measure.grouped import GroupedBuffers

    counts = (300, 0, 212, 512)
    p = GroupedProblem(experts=4, m=sum(counts), n=512, k=1024)
    buf = GroupedBuffers(p, counts, 50 << 20)
    idx = (torch.randperm(p.m, generator=torch.Generator().manual_seed(0)) // 2).int().cuda()
    buf.gather_rows(idx)
    a, b, d, cu, _ = buf.sets[0]
    from quack.gemm_config import config_supports

    config = next(c for c in enumerate_configs("sm90", p)
                  if config_supports(c.to_quack("sm90"), gather_A=True, varlen_m=True))
    d.fill_(float("nan"))
    launch(MmPlan(config, "sm90"), a, b, d, None, 1.0, 1.0, cu_seqlens_m=cu, a_idx=idx)
    err = torch.linalg.vector_norm(d.float() - buf.ref) / buf.ref_norm
    assert err < 1e-2
    # the reference is the gathered rows', not the first rows': a kernel ignoring idx fails
    launch(MmPlan(config, "sm90"), a, b, d, None, 1.0, 1.0, cu_seqlens_m=cu)
    assert torch.linalg.vector_norm(d.float() - buf.ref) / buf.ref_norm > 0.5
