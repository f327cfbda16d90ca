#!/usr/bin/env python
"""Step times of every mode compiled in one process and timed in interleaved rounds, and the
issue's step-time targets checked on them.

bench_e2e.py compiles each mode in its own fresh process (it must, for compile times) and times
the step there. At small M the steps are host-bound, and there the same ATen code ran up to
1.4x slower in one process than in another (data/bench/e2e_h200_1gpu.json.gz), while the two,
timed side by side in one process, agreed within 0.1 % (data/bench/step_ab_h200_reduced_mlp_m16
.json). So step times are compared here: each mode's compile of the workload (a function with
its own code object, static shapes) in one process, then rounds that time every mode and eager
in turn, each round starting one mode later than the last (so that no mode always runs after
the same one), the median of rounds reported.

  python scripts/step_ab.py --m 16 --out ab_m16.json [--modes ...] [--workloads mlp attn]
      [--heldout-model HEURISTICS]   (adds mode predicted-heldout: predicted with that file)
      (mode predicted-unfused: predicted without the SwiGLU fusion, fuse_swiglu=False)
      [--save-code DIR]   (each mode's Inductor output code, to tell same-kernel steps apart)
      [--pin-cpu N]   (the timing thread on CPU N alone: host-bound steps with the same code
                       differed by up to 16 % unpinned,
                       data/inputs/steps/step_h200_bounded4.json)
      [--gc-off]   (Python's garbage collector paused while timing, as timeit does)
  python scripts/step_ab.py --report ab_m*.json --out data/bench/step_h200.json
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import time
from pathlib import Path

import numpy as np

from benchlib import (HIDDEN, LIMITS, allowed_cpus, compiled_step, geomean_check, interleaved,
                      kernel_counts, limit_check, mode_installation, pinned,
                      run_and_capture_code, time_calls, wait_for_helpers, workload_classes)

from cutetune.tuner.measure.timing import launch_host_us

MODES = ("default", "max-autotune", "predicted", "reduced")
# predicted mode's variants, each held to predicted's step limit in the report (not issue targets)
VARIANTS = ("predicted-heldout", "predicted-unfused")


@contextlib.contextmanager
def _gc_paused(paused: bool):
    """Python's garbage collector collected, then off meanwhile (``paused``; else as it was),
    so no collection lands in one mode's timed batch and not in another's."""
    was = gc.isenabled()
    if paused:
        gc.collect()
        gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def measure(m: int, modes, workloads, rounds: int, heldout_model: str | None = None,
            save_code: Path | None = None, pin_cpu: int | None = None,
            gc_off: bool = False) -> dict:
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    torch._dynamo.config.automatic_dynamic_shapes = False  # static shapes, as in bench_e2e
    torch.manual_seed(0)
    x = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16)
    res = {"m": m, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "modes": list(modes), "rounds": rounds, "pinned_cpu": pin_cpu, "gc_off": gc_off,
           "launch_host_us": {"before": launch_host_us()}, "workloads": {}}
    for name in workloads:
        module = workload_classes(torch)[name]().to("cuda", torch.bfloat16).eval()
        fns, kernels, compile_s = {"eager": module}, {}, {}
        with torch.no_grad():
            for mode in modes:
                fns[mode] = compiled_step(module, mode)
                t0 = time.perf_counter()
                with mode_installation(mode, heldout_model):
                    code = run_and_capture_code(fns[mode], x)[1]
                compile_s[mode] = time.perf_counter() - t0
                kernels[mode] = kernel_counts("\n".join(code))
                if save_code is not None:
                    save_code.mkdir(parents=True, exist_ok=True)
                    (save_code / f"m{m}_{name}_{mode}.py").write_text("\n".join(code))
            helpers = wait_for_helpers(600.0)  # time the kernels the modes compiled
            recompiled = {}  # a graph Dynamo compiles again here runs without cutetune
            for mode, fn in fns.items():
                graphs = counters["stats"]["unique_graphs"]
                time_calls(torch, fn, x, repeats=1)  # warm-up
                recompiled[mode] = counters["stats"]["unique_graphs"] - graphs
            with pinned(pin_cpu), _gc_paused(gc_off):
                timed = interleaved(torch, fns, x, rounds)
        res["workloads"][name] = {
            "kernels": kernels,
            "graphs_compiled_when_timed": recompiled,
            "helpers": helpers,
            "compile_s_in_process": compile_s,  # imports and caches warm: not bench_e2e's
            "step_us": {mode: float(np.median([t["median"] for t in ts])) * 1e3
                        for mode, ts in timed.items()},
            "host_us": {mode: float(np.median([t["host"] for t in ts])) * 1e3
                        for mode, ts in timed.items()},
            # each round's step and the machine's steal meanwhile: the noise beside the medians
            "rounds_step_us": {mode: [round(t["median"] * 1e3, 2) for t in ts]
                               for mode, ts in timed.items()},
            "rounds_steal_cores": {mode: [(t["cpu"] or {}).get("steal_cores") for t in ts]
                                   for mode, ts in timed.items()},
        }
        del module, fns
        torch.cuda.empty_cache()
    res["launch_host_us"]["after"] = launch_host_us()
    return res


def counted_steps(workload: dict, drop=()) -> dict:
    """A workload's step times without the modes in ``drop`` and those Dynamo compiled again
    when they were first timed (their timed code was not the code compiled for the mode)."""
    again = workload.get("graphs_compiled_when_timed", {})
    return {mode: us for mode, us in workload.get("step_us", {}).items()
            if mode not in drop and not again.get(mode)}


def step_targets(parts: list[dict], drop=()) -> dict:
    """The issue's step-time targets (benchlib.LIMITS) per workload over one-process results
    (one per M) and their ``counted_steps``; a check needs the modes it compares in the same
    result. predicted's VARIANTS, where measured, are held to the predicted-mode limit too (not
    issue targets: predicted-heldout shows what shapes the Triton table was not fitted on get,
    predicted-unfused what the SwiGLU fusion changes). ValueError where
    two results share an M: one would hide the other."""
    ms = [p["m"] for p in parts]
    if len(set(ms)) != len(ms):
        raise ValueError(f"results at M {sorted(m for m in set(ms) if ms.count(m) > 1)} more "
                         "than once: report each run of an M on its own")
    out = {}
    for wl in sorted({w for p in parts for w in p["workloads"]}):
        pred_best, red_pred, big = {}, {}, []
        variants = {v: {} for v in VARIANTS}
        for p in sorted(parts, key=lambda p: p["m"]):
            step = counted_steps(p["workloads"].get(wl, {}), drop)
            best = [step[k] for k in ("default", "max-autotune") if k in step]
            if "predicted" in step and best:
                pred_best[p["m"]] = step["predicted"] / min(best)
                if p["m"] >= 1024:
                    big.append(pred_best[p["m"]])
            for v, by_m in variants.items():
                if v in step and best:
                    by_m[p["m"]] = step[v] / min(best)
            if "predicted" in step and "reduced" in step:
                red_pred[p["m"]] = step["reduced"] / step["predicted"]
        out[wl] = {name: limit_check(by_m, LIMITS[name]) for name, by_m in (
            ("predicted_step_over_best_ratio", pred_best),
            ("reduced_step_over_predicted_ratio", red_pred))}
        for v, by_m in variants.items():
            if by_m:
                out[wl][f"{v.replace('-', '_')}_step_over_best_ratio"] = limit_check(
                    by_m, LIMITS["predicted_step_over_best_ratio"])
        out[wl]["predicted_step_geomean_m_ge_1024_over_best"] = geomean_check(
            big, LIMITS["predicted_step_geomean_m_ge_1024_over_best"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int)
    ap.add_argument("--modes", nargs="+", default=list(MODES),
                    choices=(*MODES, "predicted-unfused"))
    ap.add_argument("--workloads", nargs="+", default=["mlp", "attn"], choices=("mlp", "attn"))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--heldout-model", help="heuristics file for an extra mode, "
                    "predicted-heldout (e.g. a Triton table fitted without these shapes)")
    ap.add_argument("--report", nargs="+", metavar="JSON",
                    help="one-process results to gather, with the targets checked on them")
    ap.add_argument("--drop-modes", nargs="+", default=[], metavar="MODE",
                    help="with --report: modes whose timings do not count (say why in --why)")
    ap.add_argument("--why", default="", help="why --drop-modes' timings do not count")
    ap.add_argument("--save-code", type=Path, metavar="DIR",
                    help="write each mode's Inductor output code there")
    ap.add_argument("--pin-cpu", type=int, metavar="N",
                    help="time on CPU N alone (compiles stay unpinned)")
    ap.add_argument("--gc-off", action="store_true",
                    help="pause Python's garbage collector while timing")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.drop_modes and not args.why:
        raise SystemExit("--drop-modes needs --why")
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    if args.report:
        parts = [json.loads(Path(f).read_text()) for f in args.report]
    try:
        if args.pin_cpu is not None:
            allowed_cpus(args.pin_cpu)  # before any compile
        targets = step_targets(parts, set(args.drop_modes)) if args.report else None
    except ValueError as e:
        raise SystemExit(str(e)) from None
    if args.report:
        res = {"parts": sorted(parts, key=lambda p: p["m"]), "targets": targets}
        if args.drop_modes:
            res["not_counted"] = {"modes": args.drop_modes, "why": args.why}
        summary = res["targets"]
    elif args.m is None:
        raise SystemExit("--m is required unless --report is given")
    else:
        modes = [*args.modes, *(["predicted-heldout"] if args.heldout_model else [])]
        res = summary = measure(args.m, modes, args.workloads, args.rounds, args.heldout_model,
                                args.save_code, args.pin_cpu, args.gc_off)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
