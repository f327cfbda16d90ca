#!/usr/bin/env python
"""Host time of one call of cutetune's fused SwiGLU ops where they run unfused (ATen), against
the same ATen calls made directly: what a step pays per call for the op's dispatch.

Each variant is called in a loop on the GPU's tensors of Llama-3-8B's up projection at a small
M (host-bound: the loop's wall time per call is host time); a cProfile of the by-M op's calls
names where its time goes.

  python scripts/op_overhead.py --m 16 --out op_overhead.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time

import torch
import torch.nn.functional as F

from cutetune.space.config import KernelConfig
from cutetune.tuner import swiglu
from cutetune.tuner.launcher import M_UNBOUNDED


def _host_us(fn, calls: int = 2000) -> float:
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    m, n, k = args.m, 14336, 4096
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    gate = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    unfused_here = ((2 * m, None), (M_UNBOUNDED, KernelConfig()))  # this M: unfused
    table = swiglu.table_ints(unfused_here)
    by_m = torch.ops.cutetune.mm_silu_mul_by_m.default

    def direct():
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        torch.mm(a, b, out=out)
        return out.mul_(F.silu(gate))

    def op_then_mm(x):  # the op between two mm, as in a compiled MLP
        return by_m(x, b, torch.mm(x, b), table) @ b.t()

    def mm_pointwise_mm(x):
        return (F.silu(torch.mm(x, b)) * torch.mm(x, b)) @ b.t()

    graphs = {"op_then_mm": op_then_mm, "mm_pointwise_mm": mm_pointwise_mm}
    variants = {
        "direct_aten": direct,
        "by_m_op": lambda: by_m(a, b, gate, table),
        "by_m_python": lambda: swiglu.mm_silu_mul_by_m._init_fn(a, b, gate, table),
        "eager_pointwise": lambda: F.silu(gate) * (a @ b),
        **{f"compiled_{name}": (lambda fn=torch.compile(fn, dynamic=False): fn(a))
           for name, fn in graphs.items()},
        **{f"eager_{name}": (lambda fn=fn: fn(a)) for name, fn in graphs.items()},
    }
    with torch.no_grad():
        res = {"m": m, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "host_us": {name: _host_us(fn) for name, fn in variants.items()}}
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(500):
            by_m(a, b, gate, table)
        prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(25)
    res["by_m_op_profile"] = text.getvalue()
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res["host_us"]))


if __name__ == "__main__":
    main()
