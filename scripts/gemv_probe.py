#!/usr/bin/env python
"""Small-M GEMMs written as Triton reductions: step and GPU time of the Llama-3-8B MLP and
attention projections compiled by Inductor with each ``x @ W.t()`` as
``(x[:, None, :] * W).sum(-1)`` (fp32 accumulation), beside Inductor's default (ATen),
max-autotune and cutetune predicted, all compiled in one process and timed in interleaved
rounds (scripts/step_ab.py's method).

Why: at small M a compiled step waits on the host, and an extern GEMM launch (ATen's or
cutetune's quack library) costs the host 7-12 us more than a Triton launch
(data/bench/launch_probe_h200*.json.gz), while Inductor's Triton mm templates, cheap to launch,
run M=1's down projection 21 % slower than cuBLAS on the GPU
(data/triton_mm/h200_bf16_retimed_exh.jsonl). A matrix-vector product is a reduction over K
per output: Inductor generates it as a Triton reduction kernel (a cheap launch) that streams
W once, can fuse the gate and up products and SwiGLU's pointwise product, and may run as fast
as cuBLAS on the GPU. ``nmk`` lays the reduction out as (N, M, K) so that neighbouring
programs share a row of W (for M > 1). On the H200 it did not: at M=1 the MLP's reductions
cost the host what the templates do but ran 112 us on the GPU against cuBLAS's 95, and from
M=4 they read W once per row (data/bench/gemv_probe_h200*.json.gz).

  python scripts/gemv_probe.py --ms 1 4 16 128 --out gemv_probe_h200.json
      (committed as data/bench/gemv_probe_h200.json.gz, by gzip -9n)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e import HIDDEN, _kernel_counts, _rel_err, _workloads  # noqa: E402
from step_ab import (_compiled, _fresh_step, _installation, _interleaved,  # noqa: E402
                     _pinned, _run_and_capture_code, _wait_for_helpers)

MODES = ("default", "max-autotune", "predicted", "gemv", "gemv-nmk")


def linear_as_reduction(x, w, order: str):
    """``x @ w.t()`` as a reduction over K in fp32: ``mk`` reduces an (M, N, K) product,
    ``nmk`` an (N, M, K) one, transposed back."""
    if order == "mk":
        return (x[:, None, :].float() * w[None].float()).sum(-1).to(x.dtype)
    return (x[None, :, :].float() * w[:, None, :].float()).sum(-1).t().to(x.dtype)


class AsReductions(torch.nn.Module):
    """bench_e2e's MLP or attention projections with each linear as ``linear_as_reduction``
    (the same weights)."""

    def __init__(self, module, order: str):
        super().__init__()
        self.inner, self.order = module, order

    def forward(self, x):
        mod = self.inner

        def linear(lin, inp):
            return linear_as_reduction(inp, lin.weight, self.order)

        if hasattr(mod, "gate"):
            return linear(mod.down, torch.nn.functional.silu(linear(mod.gate, x))
                          * linear(mod.up, x))
        return linear(mod.o, linear(mod.q, x)), linear(mod.k, x), linear(mod.v, x)


def gpu_us(fn, x, calls: int = 20, replays: int = 10) -> float:
    """GPU time per call with the host out of the way: ``calls`` calls captured in one CUDA
    graph, replayed ``replays`` times, the median replay over ``calls``."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn(x)
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return sorted(times)[len(times) // 2]


def measure(m: int, workloads, rounds: int, pin_cpu: int | None, gemv_max_m: int) -> dict:
    torch._dynamo.reset()
    torch._dynamo.config.automatic_dynamic_shapes = False  # static shapes at every M
    torch.manual_seed(0)
    classes = _workloads(torch)
    out = {"m": m, "workloads": {}}
    for name in workloads:
        module = classes[name]().cuda().to(torch.bfloat16).eval()
        x = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            ref = module.float()(x.float())
            module.to(torch.bfloat16)
            fns, codes, errs = {"eager": _fresh_step(module)}, {}, {}
            for mode in MODES:
                if mode.startswith("gemv") and m > gemv_max_m:
                    continue
                if mode.startswith("gemv"):
                    target = AsReductions(module, "mk" if mode == "gemv" else "nmk")
                    fn = _compiled(target, "default")
                    got, codes[mode] = _run_and_capture_code(fn, x)
                else:
                    with _installation(mode, None):
                        fn = _compiled(module, mode)
                        got, codes[mode] = _run_and_capture_code(fn, x)
                fns[mode] = fn
                errs[mode] = _rel_err(torch, got, ref)
            helpers = _wait_for_helpers(600.0)  # predicted's fused kernels, if any were built
            with _pinned(pin_cpu):
                timed = _interleaved(torch, fns, x, rounds)
            gpu = {mode: gpu_us(fn, x) for mode, fn in fns.items()}
        step = {mode: sorted(t["median"] * 1e3 for t in ts)[len(ts) // 2]
                for mode, ts in timed.items()}
        host = {mode: sorted(t["host"] * 1e3 for t in ts)[len(ts) // 2]
                for mode, ts in timed.items()}
        out["workloads"][name] = {
            "step_us": step, "host_us": host, "gpu_us": gpu, "rel_err": errs,
            "helpers": helpers,
            "kernels": {mode: _kernels("\n".join(c)) for mode, c in codes.items()},
            "rounds_step_us": {mode: [round(t["median"] * 1e3, 2) for t in ts]
                               for mode, ts in timed.items()}}
        print(json.dumps({"m": m, "workload": name, "step_us": step, "host_us": host,
                          "gpu_us": gpu, "rel_err": errs}), flush=True)
    return out


def _kernels(code: str) -> dict:
    """bench_e2e's GEMM kernel counts of a graph's code, and its Triton kernels (reductions,
    looped or persistent, among them)."""
    return {**_kernel_counts(code), "triton_kernels": code.count("async_compile.triton("),
            "triton_reductions": len(re.findall(r"async_compile\.triton\('triton_(?:red|per)_",
                                                code))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--workloads", nargs="+", default=["mlp", "attn"])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--pin-cpu", type=int)
    ap.add_argument("--gemv-max-m", type=int, default=16,
                    help="the reduction forms only up to this M (they read W once per row)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    parts = [measure(m, args.workloads, args.rounds, args.pin_cpu, args.gemv_max_m)
             for m in args.ms]
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                          "torch": torch.__version__, "parts": parts},
                                         indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
