#!/usr/bin/env python
"""What a run-time switch between two compiled variants of a graph costs a step: the
Llama-3-8B MLP compiled by Inductor's default as it is, and inside ``torch.cond`` on a CPU
flag tensor (both branches the same MLP, so the difference is the switch alone), timed in
interleaved rounds in one process (``step_ab.py``'s method).

Why: at M <= 128 the best kernels for a step depend on the host's speed (ATen on a fast host,
Triton templates on a slow one), which compile time cannot tell and which varies between
processes on one machine (README, torch.compile). A graph that switched at run time would pay
this cost on every step, on the host, which is what a slow host has least of.

  python scripts/cond_probe.py --ms 1 16 128 [--rounds 15] [--pin-cpu N] --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e import HIDDEN, _workloads  # noqa: E402
from step_ab import _interleaved, _pinned  # noqa: E402

VARIANTS = ("plain", "cond")


def switched(torch, module, flag):
    """``module`` behind ``torch.cond(flag, ...)`` with the same module in both branches."""
    def step(x):
        return torch.cond(flag, lambda t: module(t), lambda t: module(t), (x,))
    return step


def measure(ms, rounds: int, pin_cpu: int | None) -> dict:
    import torch

    torch._dynamo.config.automatic_dynamic_shapes = False
    torch.manual_seed(0)
    module = _workloads(torch)["mlp"]().to("cuda", torch.bfloat16).eval()
    flag = torch.zeros((), dtype=torch.bool)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "rounds": rounds, "pinned_cpu": pin_cpu, "by_m": {}}
    for m in ms:
        torch._dynamo.reset()
        x = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            fns = {"plain": torch.compile(lambda t: module(t)),
                   "cond": torch.compile(switched(torch, module, flag))}
            outs = {name: fn(x) for name, fn in fns.items()}
            err = float((outs["cond"] - outs["plain"]).abs().max())
            with _pinned(pin_cpu):
                timed = _interleaved(torch, fns, x, rounds)
        res["by_m"][str(m)] = {
            "step_us": {v: float(np.median([t["median"] for t in timed[v]])) * 1e3
                        for v in VARIANTS},
            "host_us": {v: float(np.median([t["host"] for t in timed[v]])) * 1e3
                        for v in VARIANTS},
            "rounds_host_us": {v: [round(t["host"] * 1e3, 2) for t in timed[v]]
                               for v in VARIANTS},
            "max_abs_diff": err,
        }
        r = res["by_m"][str(m)]
        print(f"M={m}: step {r['step_us']['plain']:.1f} -> {r['step_us']['cond']:.1f} us, "
              f"host {r['host_us']['plain']:.1f} -> {r['host_us']['cond']:.1f} us", flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 16, 128])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--pin-cpu", type=int)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    res = {"command": "python scripts/cond_probe.py " + " ".join(sys.argv[1:]),
           **measure(args.ms, args.rounds, args.pin_cpu)}
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
