#!/usr/bin/env python
"""Step times of a Llama-3-8B decoder stack at small M, with and without CUDA graphs, every
mode compiled in one process and timed in interleaved rounds (issue #36).

The stack: ``--layers`` decoder layers (RMSNorm, q/k/v/o projections, causal SDPA with
grouped KV heads over the M tokens, RMSNorm, SwiGLU MLP), bf16, static shapes. Per M, in one
process (so that host speed, which differs between processes, does not differ between modes):

  cudagraphs     default, max-autotune, predicted, reduced, each compiled as torch.compile's
                 mode="reduce-overhead" does (``triton.cudagraphs``; max-autotune as
                 mode="max-autotune"): Inductor's CUDA graphs replay each step.
  no_cudagraphs  the same four without graphs, and predicted-gputime and reduced-gputime: those
                 two with the host-cost machinery off (``QUACK_LAUNCH_HOST_US`` 0, so they
                 decide as under graphs). Whether that machinery pays: the sums over the M grid
                 of predicted against predicted-gputime, reduced against reduced-gputime.

Timed by CUDA events over batches of calls, the batches of all rounds pooled: median, p20,
p80 in us per step. Then each mode's step is profiled apart (``benchlib.gpu_kernels``): the
GPU's busy time, kernels per step and the top kernels, which say where two modes differ.
Inductor's FX-graph and AOTAutograd caches are off, so that no mode loads another's code
(predicted and predicted-gputime share a cache key); its autotune cache stays, so
max-autotune's second compile reuses its benchmark. The result file is rewritten after
each M with what is done; an M that the --budget-s cannot cover is recorded as skipped.

  python scripts/bench_cudagraphs.py --out data/bench/cudagraphs_small_m_h200.json.gz
      [--ms 1 16 128 256 4 64] [--layers 2] [--rounds 10] [--budget-s 470] [--resume FILE...]
      [--rerun M...]
  python scripts/bench_cudagraphs.py --plan      # what would run, no GPU
  python scripts/bench_cudagraphs.py --merge-only --resume FILE... --out FILE   # no GPU

``--resume`` keeps the Ms that earlier calls' result files timed completely (but those of
``--rerun``) and runs the rest,
so that one grid can span calls on the GPU host; ``--merge-only`` runs none and writes the
files' Ms of ``--ms`` as one result.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

from benchlib import (HIDDEN, INTER, KV, LIMITS, compiled_step, cutetune_variables, gpu_kernels,
                      interleaved, kernel_counts, limit_check, mode_installation,
                      run_and_capture_code, time_calls, wait_for_helpers)
from cutetune.artifacts import write_artifact

MS = (1, 16, 128, 256, 4, 64)  # spread first: a budget cut leaves the range covered
MODES = ("default", "max-autotune", "predicted", "reduced")
GPUTIME = ("predicted-gputime", "reduced-gputime")  # no-graphs only
HEAD_DIM = 128
FIRST_M_GUESS_S = 150.0  # before one M has been timed


def groups() -> dict[str, tuple[str, ...]]:
    """The modes of each group, in compile order: without graphs first, so that the fused
    kernels the -gputime variants send to cutetune's compile helper (the ones predicted mode
    runs under graphs) are built before a CUDA graph records the step (a capture keeps the
    ATen fallback of a kernel still building)."""
    return {"no_cudagraphs": (*MODES, *GPUTIME), "cudagraphs": MODES}


# ================================================================ the workload
def decoder_stack(torch, layers: int, flash: bool = False):
    """``flash``: SDPA's inputs with a batch dimension and the KV heads repeated to the
    query's, as its flash kernel takes them; otherwise 3-D with grouped KV heads
    (``enable_gqa``), which runs SDPA's math path, in fp32."""
    nn, F = torch.nn, torch.nn.functional

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            lin = lambda i, o: nn.Linear(i, o, bias=False)  # noqa: E731
            self.q, self.k, self.v, self.o = (lin(HIDDEN, HIDDEN), lin(HIDDEN, KV),
                                              lin(HIDDEN, KV), lin(HIDDEN, HIDDEN))
            self.gate, self.up, self.down = lin(HIDDEN, INTER), lin(HIDDEN, INTER), lin(INTER,
                                                                                        HIDDEN)
            self.n1, self.n2 = nn.Parameter(torch.ones(HIDDEN)), nn.Parameter(torch.ones(HIDDEN))

        def forward(self, x):  # x: (M, HIDDEN), one sequence of M tokens
            m = x.shape[0]
            h = F.rms_norm(x, (HIDDEN,), self.n1)
            heads = lambda t: t.view(m, -1, HEAD_DIM).transpose(0, 1)  # noqa: E731
            q, k, v = heads(self.q(h)), heads(self.k(h)), heads(self.v(h))
            if flash:
                q, k, v = q[None], *(t.repeat_interleave(HIDDEN // KV, dim=0)[None]
                                     for t in (k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=not flash)
            x = x + self.o(a.transpose(-3, -2).reshape(m, HIDDEN))
            h = F.rms_norm(x, (HIDDEN,), self.n2)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    return nn.Sequential(*(Layer() for _ in range(layers)))


def installation(mode: str):
    """The mode's cutetune installation; the -gputime variants with the host-cost rules off."""
    if mode not in GPUTIME:
        return mode_installation(mode, None)
    from unittest import mock

    from cutetune.tuner.inductor import decisions

    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(decisions, "QUACK_LAUNCH_HOST_US", 0.0))
    stack.enter_context(mode_installation(mode.removesuffix("-gputime"), None))
    return stack


# ================================================================ one M, every mode
def measure_m(torch, m: int, layers: int, rounds: int) -> dict:
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    module = decoder_stack(torch, layers).to("cuda", torch.bfloat16).eval()
    x = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16)
    row = {"m": m, "status": "ok", "compile_s": {}, "kernels": {}, "rel_err": {}, "helpers": {}}
    fns: dict[str, dict] = {g: {} for g in groups()}
    with torch.no_grad():
        ref = module(x).float()
        for group, modes in groups().items():
            graphs = group == "cudagraphs"
            for mode in modes:
                base = mode.removesuffix("-gputime")
                compiled = compiled_step(module, base, cuda_graphs=graphs)
                t0 = time.perf_counter()
                with installation(mode):
                    out, code = run_and_capture_code(compiled, x)
                key = f"{group}/{mode}"
                row["compile_s"][key] = round(time.perf_counter() - t0, 2)
                row["kernels"][key] = kernel_counts("\n".join(code))
                row["rel_err"][key] = float((out.float() - ref).norm() / ref.norm())
                fns[group][mode] = _graph_step(torch, compiled) if graphs else compiled
            row["helpers"][group] = wait_for_helpers(600.0)
            for fn in fns[group].values() if not graphs else ():
                fn(x)  # first launches from the libraries the helper built
        row["graphs_compiled_when_timed"] = {}
        for group, by_mode in fns.items():
            for mode, fn in by_mode.items():
                before = counters["stats"]["unique_graphs"]
                time_calls(torch, fn, x, repeats=1)  # warm-up (graphs: record, then replay)
                row["graphs_compiled_when_timed"][f"{group}/{mode}"] = (
                    counters["stats"]["unique_graphs"] - before)
        for group, by_mode in fns.items():
            rounds_of = interleaved(torch, by_mode, x, rounds, repeats=5)
            row[group] = step_stats({mode: [b for t in ts for b in t["batches"]]
                                     for mode, ts in rounds_of.items()})
        row["gpu"] = {f"{group}/{mode}": gpu_kernels(torch, partial(fn, x), top=20)
                      for group, by_mode in fns.items() for mode, fn in by_mode.items()}
    return row


def _graph_step(torch, compiled):
    """A call of ``compiled`` as a new step of Inductor's CUDA graphs (its outputs may be
    overwritten by the next replay: the timing keeps none)."""
    def step(x):
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(x)
    return step


def step_stats(batches: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """us per step, per mode: median, p20 and p80 over its batches."""
    return {mode: dict(zip(("median", "p20", "p80"),
                           (round(float(v) * 1e3, 2) for v in np.quantile(t, (0.5, 0.2, 0.8)))))
            for mode, t in batches.items()}


# ================================================================ the rows and the checks
def result_row(measured: dict, group: str) -> dict:
    """One M's row of ``group``: each mode's step_us, predicted over the better of default and
    max-autotune, reduced over predicted (None where a mode is missing)."""
    step = {mode: s for mode, s in measured.get(group, {}).items()
            if not measured.get("graphs_compiled_when_timed", {}).get(f"{group}/{mode}")}
    med = {mode: s["median"] for mode, s in step.items()}
    best = [med[k] for k in ("default", "max-autotune") if k in med]
    row = {"m": measured["m"], "status": measured["status"], "step_us": step,
           "ratio_predicted_over_best": (round(med["predicted"] / min(best), 4)
                                         if best and "predicted" in med else None),
           "ratio_reduced_over_predicted": (round(med["reduced"] / med["predicted"], 4)
                                            if {"reduced", "predicted"} <= med.keys() else None)}
    for mode in GPUTIME:
        if mode in med and best:
            row[f"ratio_{mode.replace('-', '_')}_over_best"] = round(med[mode] / min(best), 4)
    if measured["status"] != "ok":
        row["reason"] = measured.get("reason")
    return row


def targets(rows: list[dict]) -> dict:
    """The issue's targets under CUDA graphs, per M (benchlib.LIMITS)."""
    def by_m(key):
        return {r["m"]: r[key] for r in rows if r.get(key) is not None}
    return {"predicted_step_over_best_ratio": limit_check(
                by_m("ratio_predicted_over_best"), LIMITS["predicted_step_over_best_ratio"]),
            "reduced_step_over_predicted_ratio": limit_check(
                by_m("ratio_reduced_over_predicted"), LIMITS["reduced_step_over_predicted_ratio"])}


def host_cost_verdict(rows: list[dict]) -> dict:
    """Without graphs, per mode with host-cost rules: its step summed over the Ms where both it
    and its -gputime variant were timed, and that variant's; ``pays``: the rules' sum is the
    lower (None: nothing to compare)."""
    out = {}
    for variant in GPUTIME:
        mode = variant.removesuffix("-gputime")
        both = [r for r in rows if {mode, variant} <= r["step_us"].keys()]
        with_rules = sum(r["step_us"][mode]["median"] for r in both)
        without = sum(r["step_us"][variant]["median"] for r in both)
        out[mode] = {"ms": [r["m"] for r in both], "with_host_cost_us": round(with_rules, 2),
                     "gpu_time_only_us": round(without, 2),
                     "pays": with_rules < without if both else None}
    return out


def report(meta: dict, measured: list[dict]) -> dict:
    ordered = sorted(measured, key=lambda r: r["m"])
    rows = {g: [result_row(r, g) for r in ordered] for g in groups()}
    return {"meta": meta, "cudagraphs": rows["cudagraphs"], "targets": targets(rows["cudagraphs"]),
            "no_cudagraphs": rows["no_cudagraphs"],
            "host_cost_machinery": host_cost_verdict(rows["no_cudagraphs"]),
            "per_m": ordered}


def plan(elapsed_s: float, budget_s: float, seen_s: list[float]) -> tuple[bool, str]:
    """Whether the next M fits the budget: the longest M so far (or a first guess)."""
    need = max(seen_s, default=FIRST_M_GUESS_S)
    left = budget_s - elapsed_s
    return need <= left, f"~{need:.0f} s needed, {max(left, 0):.0f} s left"


def resumed(paths: list[Path] | None) -> tuple[list[dict], list[dict]]:
    """The Ms earlier result files timed completely (kept, not rerun: each M's modes were
    compared in one process, so Ms from two processes sit side by side; a later file's M
    replaces an earlier's), and their metas."""
    kept, metas = {}, []
    for path in paths or ():
        try:
            raw = path.read_bytes()
            earlier = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
            kept.update((r["m"], r) for r in earlier["per_m"] if r.get("status") == "ok")
            metas.append(earlier["meta"])
        except (OSError, EOFError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise SystemExit(f"--resume {path}: not a bench_cudagraphs.py result file ({e})")
    return list(kept.values()), metas


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("data/bench/cudagraphs_small_m_h200.json.gz"))
    ap.add_argument("--ms", type=int, nargs="+", default=list(MS))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=470.0,
                    help="start no M whose expected time would cross this")
    ap.add_argument("--resume", type=Path, nargs="+",
                    help="earlier runs' result files: their completed Ms are kept, not rerun")
    ap.add_argument("--rerun", type=int, nargs="+", default=[],
                    help="Ms to time again though a --resume file has them (after a change "
                         "that alters them)")
    ap.add_argument("--plan", action="store_true", help="print what would run; no GPU")
    ap.add_argument("--merge-only", action="store_true",
                    help="write the --resume files' Ms of --ms as one result, the rest of --ms "
                         "as not run; no GPU")
    args = ap.parse_args(argv)
    measured, earlier_metas = resumed(args.resume)
    measured = [r for r in measured if r["m"] not in args.rerun]
    done = {r["m"] for r in measured}
    if args.plan:
        print(json.dumps({"ms": [m for m in args.ms if m not in done], "kept": sorted(done),
                          "layers": args.layers, "rounds": args.rounds,
                          "groups": groups(), "budget_s": args.budget_s}, indent=1))
        return 0
    if args.merge_only:
        measured = [r for r in measured if r["m"] in args.ms]
        done = {r["m"] for r in measured}
        measured += [{"m": m, "status": "skipped", "reason": "not run: merged without a GPU"}
                     for m in args.ms if m not in done]
        meta = {"argv": sys.argv[1:] if argv is None else argv, "merged": earlier_metas}
        res = _write(args, meta, measured, time.perf_counter(), done)
        print(json.dumps({"targets": res["targets"],
                          "host_cost_machinery": res["host_cost_machinery"]}, indent=1))
        return 0
    started = time.perf_counter()
    import torch
    import torch._functorch.config as functorch_config
    from torch._inductor import config as inductor_config

    from cutetune.models.heuristics import PackagedHeuristics

    inductor_config.fx_graph_cache = False
    functorch_config.enable_autograd_cache = False
    torch._dynamo.config.automatic_dynamic_shapes = False  # static shapes
    torch._dynamo.config.cache_size_limit = 64
    meta = {"argv": sys.argv[1:], "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "layers": args.layers, "rounds": args.rounds,
            "heuristics_digest": PackagedHeuristics().digest, "budget_s": args.budget_s,
            "pid": os.getpid(), "started": time.time(), "variables": cutetune_variables(),
            "modes": {"cudagraphs": "torch.compile with triton.cudagraphs (mode="
                      "'reduce-overhead'); max-autotune as mode='max-autotune'",
                      "no_cudagraphs": "max-autotune: max_autotune, GEMM backends ATEN,TRITON; "
                      "-gputime: QUACK_LAUNCH_HOST_US 0"}}
    if earlier_metas:
        meta["resumed"] = {"from": [str(p) for p in args.resume], "kept_ms": sorted(done),
                           "metas": earlier_metas}
    seen = []
    for m in (m for m in args.ms if m not in done):
        fits, why = plan(time.perf_counter() - started, args.budget_s, seen)
        if not fits:
            measured.append({"m": m, "status": "skipped", "reason": f"budget: {why}"})
        else:
            t0 = time.perf_counter()
            try:
                measured.append(measure_m(torch, m, args.layers, args.rounds))
            except Exception as e:  # noqa: BLE001  (recorded; the other Ms still run)
                measured.append({"m": m, "status": "error",
                                 "reason": f"{type(e).__name__}: {e}"[:2000]})
            seen.append(time.perf_counter() - t0)
            measured[-1]["wall_s"] = round(seen[-1], 1)
            torch._dynamo.reset()
            torch.cuda.empty_cache()
        res = _write(args, meta, measured, started, done)
        r = measured[-1]
        print(f"M={m}: {r['status']} {r.get('reason', '')} "
              + json.dumps({g: {k: v["median"] for k, v in r.get(g, {}).items()}
                            for g in groups()}), flush=True)
    res = _write(args, meta, measured, started, done)
    print(json.dumps({"targets": res["targets"],
                      "host_cost_machinery": res["host_cost_machinery"]}, indent=1))
    return 0


def _write(args, meta: dict, measured: list[dict], started: float, done: set) -> dict:
    """Write the report of ``measured`` to ``args.out`` (atomically; gzipped where it ends in
    .gz) and return it."""
    meta["total_s"] = round(time.perf_counter() - started, 1)
    meta["complete"] = len(measured) == len(set(args.ms) | done) and all(
        r["status"] == "ok" for r in measured)
    res = report(meta, measured)
    write_artifact(args.out, json.dumps(res, indent=1), "benchmark result")
    return res


if __name__ == "__main__":
    sys.exit(main())
