#!/usr/bin/env python
"""Step time of Inductor's default compile and of a cutetune mode's, in one process, timed in
alternating batches with eager.

bench_e2e.py times each mode in its own fresh process (it must, for compile times). At small M
the steps are host-bound, and there the same ATen code ran up to 1.4x slower in one process
than in another (data/bench/e2e_h200_1gpu.json). Timing both compiled functions side by side
in one process tells a cost of cutetune's compiled code (its launcher, its wrappers) from a
difference between processes.

  python scripts/step_ab.py --mode predicted --workload attn --m 1 --out ab.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e import HIDDEN, _kernel_counts, _time_calls, _workloads  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("predicted", "reduced"), required=True)
    ap.add_argument("--workload", choices=("mlp", "attn"), required=True)
    ap.add_argument("--m", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch
    from torch._inductor.utils import run_and_get_code

    from cutetune.tuner.inductor import enable

    torch.manual_seed(0)
    module = _workloads(torch)[args.workload]().to("cuda", torch.bfloat16).eval()
    x = torch.randn(args.m, HIDDEN, device="cuda", dtype=torch.bfloat16)

    # two functions with their own code objects, so Dynamo keeps a cache entry for each
    def default_fn(x):
        return module(x)

    def cutetune_fn(x):
        return module(x)

    fns = {"eager": module, "default": torch.compile(default_fn)}
    kernels = {}
    with torch.no_grad():
        t0 = time.perf_counter()
        kernels["default"] = _kernel_counts("\n".join(run_and_get_code(fns["default"], x)[1]))
        compile_s = {"default": time.perf_counter() - t0}
        fns[args.mode] = torch.compile(cutetune_fn)
        t0 = time.perf_counter()
        with enable(args.mode):
            kernels[args.mode] = _kernel_counts("\n".join(run_and_get_code(fns[args.mode], x)[1]))
        compile_s[args.mode] = time.perf_counter() - t0
        rounds = {name: [] for name in fns}
        for _ in range(args.rounds):
            for name, fn in fns.items():
                rounds[name].append(_time_calls(torch, fn, x, repeats=3))
    res = {"argv": sys.argv[1:], "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "compile_s": compile_s, "kernels": kernels, "timed": {}}
    for name, rs in rounds.items():
        res["timed"][name] = {k: float(np.median([r[src] for r in rs])) * 1e3
                              for k, src in (("step_us", "median"), ("host_us", "host"))}
    base = res["timed"]["default"]["step_us"]
    res["step_ratio_to_default"] = {n: t["step_us"] / base for n, t in res["timed"].items()}
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps({k: res[k] for k in ("compile_s", "kernels", "timed",
                                          "step_ratio_to_default")}))


if __name__ == "__main__":
    main()
