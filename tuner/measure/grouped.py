"""GPU measurement of a grouped GEMM (an MoE layer's expert GEMMs, ``GroupedProblem``): each
quack config and ``torch._grouped_mm`` on the same routed rows, by ``timing``'s method
(L2-cold rotating sets, NaN-poisoned output checked against an fp32 reference, warm-up, median
of repeats with p20/p80).

The host knows only the totals; how the rows split among the experts (``counts``, from the
suite's routing) changes the time, so every row records the split it was measured with."""

from __future__ import annotations

import math

from ...models.dataset import routing_text
from ...models.kinds import GROUPED

from .timing import L2_MULTIPLE, MeasureTask, _STATE, _row, timed_outcome

ATEN_BACKEND = GROUPED.baseline_backend  # torch._grouped_mm's row in the dataset
MAX_SETS = 64


class GroupedBuffers:
    """Rotating operand sets ``(a, b, d, cu_seqlens, offs)`` for one grouped problem and one
    split of its ragged dimension, with the fp32 reference of set 0. Layouts are
    torch._grouped_mm's: varlen M, ``a`` (M_total, K) and ``b`` (E, K, N) (``fwd``: the
    transposed view of W (E, N, K); ``dgrad``: W (E, K, N) itself); varlen K, ``a``
    (M, K_total) M-major, ``b`` (K_total, N), ``d`` (E, M, N)."""

    def __init__(self, problem, counts, l2_bytes: int, seed: int = 0):
        import torch

        self.problem, self.counts = problem, tuple(int(c) for c in counts)
        p, e = problem, problem.experts
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16}
        ab, od = dt[p.dtype], dt[p.out_dtype]
        self.n_sets = max(2, min(MAX_SETS, math.ceil(L2_MULTIPLE * l2_bytes / p.min_bytes)))
        g = torch.Generator(device="cuda").manual_seed(seed)
        n = self.n_sets

        def randn(*shape):
            return torch.randn(n, *shape, device="cuda", dtype=ab, generator=g)

        if p.ragged == "m":
            a_all = randn(p.m, p.k)
            b_all = randn(e, p.n, p.k).mT if p.b_major == "k" else randn(e, p.k, p.n)
            d_all = torch.empty(n, p.m, p.n, device="cuda", dtype=od)
        else:
            a_all = randn(p.k, p.m).mT  # (M, K_total), M-major
            b_all = randn(p.k, p.n)
            d_all = torch.empty(n, e, p.m, p.n, device="cuda", dtype=od)
        offs = torch.tensor(self.counts, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
        cu = torch.cat([torch.zeros(1, dtype=torch.int32, device="cuda"), offs])
        self.sets = [(a_all[i], b_all[i], d_all[i], cu, offs) for i in range(n)]
        self._aim(*self.sets[0][:2])

    def gather_rows(self, idx) -> None:
        """Check launches against a GEMM whose row i is row ``idx[i]`` of ``a`` (varlen M): a
        kernel that gathers A's rows (quack's ``A_idx``), or a copy ``a[idx]`` before it."""
        a, b = self.sets[0][:2]
        self._aim(a[idx.long()], b)

    def _aim(self, a, b) -> None:
        """Launches are checked against ``a @ b`` by expert, in fp32 (``ref``, ``ref_norm``)."""
        import torch

        self.ref = None  # the earlier reference is freed before the new one is made
        self.ref = self._reference(a, b)
        self.ref_norm = torch.linalg.vector_norm(self.ref)

    def _reference(self, a, b):
        import torch

        p, bounds = self.problem, [0, *torch.tensor(self.counts).cumsum(0).tolist()]
        if p.ragged == "m":
            ref = torch.empty(p.m, p.n, device="cuda", dtype=torch.float32)
            for e, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
                ref[lo:hi] = a[lo:hi].float() @ b[e].float()
        else:
            ref = torch.empty(p.experts, p.m, p.n, device="cuda", dtype=torch.float32)
            for e, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
                ref[e] = a[:, lo:hi].float() @ b[lo:hi].float()  # an empty expert: zeros
        return ref


def _buffers(problem, counts) -> GroupedBuffers:
    buf = _STATE.get("buffers")
    if not isinstance(buf, GroupedBuffers) or (buf.problem, buf.counts) != (problem, counts):
        import torch

        _STATE["buffers"] = None  # free the previous problem's sets first
        torch.cuda.empty_cache()
        buf = _STATE["buffers"] = GroupedBuffers(problem, counts, _STATE["env"]["l2_bytes"])
    return buf


def measure_grouped(task: MeasureTask) -> list[dict]:
    """One row per config, and one for torch._grouped_mm when ``task.cublas`` (the ATen
    baseline), each with the split ``task.counts`` it ran on."""
    import time

    import torch

    from ..kernels.quack_gemm import grouped_kernel

    buf = _buffers(task.problem, tuple(task.counts))
    extra = {"expert_counts": routing_text(buf.counts)}
    rows = []
    if task.cublas:
        def aten(a, b, d, cu, offs):
            return torch._grouped_mm(a, b, offs=offs)
        rows.append(_row(task, ATEN_BACKEND, None, **timed_outcome(aten, buf, task.policy),
                         **extra))
    for config in task.configs:
        t0 = time.perf_counter()
        try:
            kernel = grouped_kernel(config, task.problem.arch, task.problem.ragged)
            kernel(*buf.sets[0][:4])  # loads the kernel from quack's cache (or compiles it)
            torch.cuda.synchronize()
        except Exception as e:  # a config that raises is a data point, not the end of the run
            torch.cuda.synchronize()
            rows.append(_row(task, "quack", config, status="runtime_error",
                             error=f"{type(e).__name__}: {e}"[:1000], **extra))
            continue
        load_s = time.perf_counter() - t0
        run = lambda a, b, d, cu, offs, kernel=kernel: kernel(a, b, d, cu)  # noqa: E731
        rows.append(_row(task, "quack", config, **timed_outcome(run, buf, task.policy),
                         load_s=load_s, **extra))
    return rows
