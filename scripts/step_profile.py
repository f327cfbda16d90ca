#!/usr/bin/env python
"""Where a compiled step's time goes: GPU kernels or the host, in one fresh process.

step_ab.py found the default's compiled MLP at small M 1.3-1.6x slower than eager in some
processes and not in others, with host time per call near the step time in both cases; that
cannot tell a host-bound step from one whose launch queue is full. Here each mode is timed as
step_ab.py times it and then profiled (torch.profiler, CPU and CUDA) over ``--calls`` calls:
the GPU kernels each call ran (name, time per call) and their sum, set against the step time.
A step whose kernel sum is near its time is GPU-bound; one whose kernels are the fast
process's is host-bound.

  python scripts/step_profile.py --m 1 --workload mlp --out prof.json   # one process
      [--dynamic-from M0]   (compiled at M0 with M dynamic, then profiled at --m)
  python scripts/step_profile.py --report prof_*.json     # the processes side by side
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e import HIDDEN, _kernel_counts, _time_calls, _workloads  # noqa: E402
from step_ab import _compiled, _installation, _run_and_capture_code  # noqa: E402


def _profile(torch, fn, x, calls: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(x)
        torch.cuda.synchronize()
    gpu, cpu = defaultdict(float), {}
    for ev in prof.key_averages():
        if ev.self_device_time_total > 0 and ev.device_type == torch.autograd.DeviceType.CUDA:
            gpu[ev.key] += ev.self_device_time_total / calls
        elif ev.self_cpu_time_total > 0:
            cpu[ev.key] = ev.self_cpu_time_total / calls
    top_cpu = dict(sorted(cpu.items(), key=lambda kv: -kv[1])[:12])
    return {"gpu_kernels_us": dict(gpu), "gpu_sum_us": sum(gpu.values()),
            "cpu_self_us_top": top_cpu}


def measure(m: int, workload: str, modes, calls: int, dynamic_from: int | None = None) -> dict:
    """With ``dynamic_from``, each mode is compiled at that M, marked dynamic (one graph for
    every M, as step_dynamic.py compiles), then run at ``m``."""
    import torch

    torch._dynamo.config.automatic_dynamic_shapes = False
    torch.manual_seed(0)
    x = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16)
    module = _workloads(torch)[workload]().to("cuda", torch.bfloat16).eval()
    res = {"m": m, "workload": workload, "torch": torch.__version__,
           "dynamic_from": dynamic_from, "modes": {}}
    with torch.no_grad():
        fns, kernels = {"eager": module}, {}
        for mode in modes:
            fns[mode] = _compiled(module, mode)  # max-autotune with its options
            x0 = x
            if dynamic_from is not None:
                x0 = torch.randn(dynamic_from, HIDDEN, device="cuda", dtype=torch.bfloat16)
                torch._dynamo.mark_dynamic(x0, 0)
            with _installation(mode, None):
                code = _run_and_capture_code(fns[mode], x0)[1]
                code += _run_and_capture_code(fns[mode], x)[1]  # nothing new unless M=1
                kernels[mode] = _kernel_counts("\n".join(code))
        for mode, fn in fns.items():
            t = _time_calls(torch, fn, x, repeats=5)
            res["modes"][mode] = {"step_us": t["median"] * 1e3, "host_us": t["host"] * 1e3,
                                  "kernels": kernels.get(mode), **_profile(torch, fn, x, calls)}
    return res


def report(paths) -> None:
    for path in paths:
        d = json.loads(Path(path).read_text())
        print(f"{Path(path).name}: {d['workload']} M={d['m']}")
        for mode, r in d["modes"].items():
            kern = ", ".join(f"{k[:48]} {v:.1f}" for k, v in
                             sorted(r["gpu_kernels_us"].items(), key=lambda kv: -kv[1]))
            print(f"  {mode:>9}: step {r['step_us']:6.1f} us, host {r['host_us']:6.1f}, "
                  f"GPU kernels {r['gpu_sum_us']:6.1f} ({kern})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--workload", default="mlp", choices=("mlp", "attn"))
    ap.add_argument("--modes", nargs="+", default=["default", "predicted"])
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--dynamic-from", type=int, metavar="M0",
                    help="compile at M0 with M marked dynamic, then profile at --m")
    ap.add_argument("--out")
    ap.add_argument("--report", nargs="+", metavar="JSON")
    args = ap.parse_args()
    if args.report:
        report(args.report)
        return
    res = measure(args.m, args.workload, args.modes, args.calls, args.dynamic_from)
    Path(args.out).write_text(json.dumps(res, indent=1))
    report([args.out])


if __name__ == "__main__":
    main()
