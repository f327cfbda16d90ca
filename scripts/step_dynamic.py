#!/usr/bin/env python
"""Step times of every mode compiled once with a dynamic M and run at many M in one process.

A served or trained model meets many batch and sequence sizes: after its second size,
torch.compile recompiles the graph with that size symbolic (automatic dynamic shapes), and
that one graph then runs every size. This compiles each mode's workload the same way (its
input's M marked dynamic, compiled at ``--compile-m``), runs it at each of ``--ms`` inside the
mode's installation (sizes Dynamo specializes, M=1, compile a graph of their own there), waits
for cutetune's compile helper, then times every mode and eager in interleaved rounds per M, as
``step_ab.py`` does for static shapes. Reported per workload and M: each mode's step time, its
ratio to the better of default and max-autotune, the relative error against eager, the
graphs each mode compiled and the kernels its code calls.

  python scripts/step_dynamic.py --out data/bench/step_dynamic_h200.json
      [--ms 1 16 128 1024 2048 4096 8192] [--compile-m 2048] [--modes ...] [--workloads ...]
      [--rounds 7] [--pin-cpu N] [--save-code DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from benchlib import (HIDDEN, compiled_step, interleaved, kernel_counts, mode_installation,
                      pinned, rel_err, run_and_capture_code, time_calls, wait_for_helpers,
                      workload_classes)

MODES = ("default", "max-autotune", "predicted")
MS = (1, 16, 128, 1024, 2048, 4096, 8192)


def measure(ms, compile_m: int, modes, workloads, rounds: int, pin_cpu: int | None = None,
            save_code: Path | None = None) -> dict:
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    # every mode's step is a code object of its own, but Dynamo's recompile limit (8) counted
    # them together: with two graphs per mode (M=1 is specialized) the last modes ran eager
    torch._dynamo.config.recompile_limit = 64
    torch.manual_seed(0)
    xs = {m: torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16) for m in ms}
    res = {"ms": list(ms), "compile_m": compile_m, "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "modes": list(modes), "rounds": rounds,
           "pinned_cpu": pin_cpu, "workloads": {}}
    for name in workloads:
        module = workload_classes(torch)[name]().to("cuda", torch.bfloat16).eval()
        fns, kernels, graphs, first_call_s, errors = {"eager": module}, {}, {}, {}, {}
        with torch.no_grad():
            refs = {m: module(x) for m, x in xs.items()}
            for mode in modes:
                fn = fns[mode] = compiled_step(module, mode)
                x0 = torch.randn(compile_m, HIDDEN, device="cuda", dtype=torch.bfloat16)
                torch._dynamo.mark_dynamic(x0, 0)
                before = counters["stats"]["unique_graphs"]
                with mode_installation(mode, None):
                    t0 = time.perf_counter()
                    code = run_and_capture_code(fn, x0)[1]
                    first_call_s[mode] = {"compile": time.perf_counter() - t0}
                    for m, x in xs.items():  # each M's first call: a new kernel loads here
                        t0 = time.perf_counter()
                        more = run_and_capture_code(fn, x)[1]
                        torch.cuda.synchronize()
                        first_call_s[mode][m] = time.perf_counter() - t0
                        code += more
                graphs[mode] = counters["stats"]["unique_graphs"] - before
                kernels[mode] = kernel_counts("\n".join(code))
                if save_code is not None:
                    save_code.mkdir(parents=True, exist_ok=True)
                    (save_code / f"dynamic_{name}_{mode}.py").write_text("\n".join(code))
            helpers = wait_for_helpers(600.0)
            for mode, fn in fns.items():
                errors[mode] = {m: rel_err(torch, fn(x), refs[m]) for m, x in xs.items()}
            timed = {}
            graphs_before = counters["stats"]["unique_graphs"]
            with pinned(pin_cpu):
                for m, x in xs.items():
                    for fn in fns.values():
                        time_calls(torch, fn, x, repeats=1)  # warm-up
                    timed[m] = interleaved(torch, fns, x, rounds)
        step = {m: {mode: float(np.median([t["median"] for t in ts])) * 1e3
                    for mode, ts in by_mode.items()} for m, by_mode in timed.items()}
        res["workloads"][name] = {
            "kernels": kernels, "graphs_compiled": graphs,
            "graphs_compiled_when_timed": counters["stats"]["unique_graphs"] - graphs_before,
            "first_call_s": first_call_s, "helpers": helpers, "rel_err": errors,
            "step_us": step,
            "rounds_step_us": {m: {mode: [round(t["median"] * 1e3, 2) for t in ts]
                                   for mode, ts in by_mode.items()}
                               for m, by_mode in timed.items()},
            "predicted_over_best": over_best(step),
        }
        del module, fns
        torch.cuda.empty_cache()
    return res


def over_best(step: dict) -> dict:
    """Per M, predicted mode's step time over the better of default's and max-autotune's
    (those measured), and their geomean over M >= 1024; where reduced mode ran, its step over
    predicted mode's per M."""
    out, reduced = {}, {}
    for m, by_mode in step.items():
        best = [by_mode[k] for k in ("default", "max-autotune") if k in by_mode]
        if "predicted" in by_mode and best:
            out[m] = by_mode["predicted"] / min(best)
        if "predicted" in by_mode and "reduced" in by_mode:
            reduced[m] = by_mode["reduced"] / by_mode["predicted"]
    big = [r for m, r in out.items() if int(m) >= 1024]
    return {"by_m": out,
            "geomean_m_ge_1024": float(np.exp(np.mean(np.log(big)))) if big else None,
            **({"reduced_over_predicted": reduced} if reduced else {})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ms", type=int, nargs="+", default=list(MS))
    ap.add_argument("--compile-m", type=int, default=2048)
    ap.add_argument("--modes", nargs="+", default=list(MODES),
                    choices=("default", "max-autotune", "predicted", "reduced"))
    ap.add_argument("--workloads", nargs="+", default=["mlp", "attn"], choices=("mlp", "attn"))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--pin-cpu", type=int, metavar="N")
    ap.add_argument("--save-code", type=Path, metavar="DIR")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    res = measure(args.ms, args.compile_m, args.modes, args.workloads, args.rounds,
                  args.pin_cpu, args.save_code)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps({wl: {"predicted_over_best": r["predicted_over_best"],
                           "graphs": r["graphs_compiled"], "kernels": r["kernels"]}
                      for wl, r in res["workloads"].items()}))


if __name__ == "__main__":
    main()
