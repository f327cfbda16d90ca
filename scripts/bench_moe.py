"""MoE expert GEMMs on the GPU: cutetune's grouped GEMMs against torch._grouped_mm and
Inductor's max-autotune, one GEMM at a time and in a whole MoE block.

    python scripts/bench_moe.py gemms --out FILE [--max-autotune N] [--routings skewed,balanced]
    python scripts/bench_moe.py block --model M --mode MODE --out FILE
    python scripts/bench_moe.py run --out DIR [--budget-s S]
    python scripts/bench_moe.py gather --out FILE [--configs N]
    python scripts/bench_moe.py plot FILE [--out PNG]

``gemms``: every grouped GEMM of the block (gate+up and down; forward, input and weight
gradients) of DeepSeek-V3 and Qwen3-30B-A3B at each token count, on each of ``--routings``
(``space.suites.ROUTINGS``: balanced is near what the block's router of random weights gives,
skewed a Dirichlet draw): torch._grouped_mm and the predicted pick (the shipped model's top-1,
or ATen where its fallback says so), timed L2-cold by the dataset's harness
(``tuner.measure.timing.time_launches``); for the first N forward GEMMs at 1024 and 8192
tokens also Inductor's max-autotune choice, with its compile seconds; and the host time of one
eager call at 128 tokens, torch._grouped_mm against cutetune.grouped_mm and its parts alone.

``block``: the MoE block (router softmax and top-k, token permutation, grouped gate+up,
SwiGLU, grouped down, weighted unpermute) in one mode: eager (torch._grouped_mm),
cutetune_eager (cutetune.grouped_mm), default (torch.compile), predicted (cutetune predicted
mode), reduced (cutetune reduced mode: with the block's dynamic token count its grouped
GEMMs get predicted mode's table per range, and its dense GEMMs the benchmarked top-k) or
max-autotune (max-autotune-no-cudagraphs). Compiled once per phase with a dynamic
token count; forward (inference) and forward+backward (training); step time median with p20
and p80; compile seconds (the first call; predicted mode's calls run ATen until the compile
helper has built its kernels, whose wait is recorded apart); relative error against the block
in fp32; per token count, the GPU's kernel time per step (what of the step is not the
GPU's is the host's) with the top kernels, and how the router spread the rows over the experts.

``run``: every mode's block in a fresh process with cold caches, then ``gemms``; writes
DIR/moe_block_h200.json (with speedups against default), its plot DIR/moe_block_h200.png and
DIR/moe_gemms_h200.json.

``gather``: whether quack's gather (``A_idx``) should fold the token permutation into the up
projection: per model and token count (balanced routing), gate+up's forward on rows
``x[idx]``, each token's row taken top_k times in expert order, timed L2-cold as ``gemms``:
the copy ``x[idx]`` then torch._grouped_mm, the copy then the predicted pick, and quack
reading the rows through ``idx`` (cp.async loads of A instead of TMA) with the pick made fit
for quack's gather (cluster_n 1, static scheduler) and the model's best ``--configs`` configs
that quack's gather takes (``quack.gemm_config.config_supports``).

``plot``: a ``run``'s block results as a figure: per model and phase, each mode's step time
against the token count (median, p20-p80 bars) and its speedup over default.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

import numpy as np

from benchlib import gpu_kernels, save_png
from cutetune.space.suites import (MOE_MODELS, ROUTINGS, expert_gemm, expert_projections,
                                   routing_counts)

MODELS = ("deepseek_v3", "qwen3_30b_a3b")
TOKENS = (128, 1024, 8192, 32768)
MODES = ("eager", "cutetune_eager", "default", "predicted", "reduced", "max-autotune")
GEMMS = ("fwd", "dgrad", "wgrad")
MAX_AUTOTUNE_TOKENS = (1024, 8192)  # max-autotune's compile takes 10-20 s a GEMM: a subset


def _quantiles(times) -> dict:
    median, p20, p80 = np.quantile(times, (0.5, 0.2, 0.8))
    return {"median": float(median), "p20": float(p20), "p80": float(p80)}


# ================================================================ one GEMM at a time
def gemms(args) -> dict:
    import torch

    from cutetune.tuner.kernels.grouped_mm import picker
    from cutetune.tuner.measure.timing import TimingPolicy

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    policy = TimingPolicy(warmup=3, min_reps=10, max_reps=50, target_ms=20.0)
    pick, rows, autotuned = picker().pick, [], 0
    routings = args.routings.split(",")
    if not set(routings) <= set(ROUTINGS):
        raise SystemExit(f"--routings: each of {', '.join(ROUTINGS)}, got {args.routings!r}")
    deadline = time.time() + args.budget_s
    for model in args.models.split(","):
        layer = MOE_MODELS[model]
        for tokens, routing in itertools.product(TOKENS, routings):
            for proj, (n, k) in expert_projections(layer).items():
                for gemm in GEMMS:
                    if time.time() > deadline:
                        break
                    p = expert_gemm(gemm, layer.experts, tokens * layer.top_k, n, k)
                    row = {"model": model, "tokens": tokens, "proj": proj, "gemm": gemm,
                           "routing": routing, "problem": p.key()}
                    tune = (gemm == "fwd" and tokens in MAX_AUTOTUNE_TOKENS
                            and autotuned < args.max_autotune)
                    counts = routing_counts(p.experts, tokens * layer.top_k, routing)
                    _guarded(row, lambda: _gemm_row(torch, row, p, counts, pick(p), tune,
                                                    l2, policy))
                    autotuned += "max_autotune_ms" in row
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    models = args.models.split(",")
    timed = [r for r in rows if "error" not in r]
    return {"rows": rows, "complete": len(timed) == (len(models) * len(TOKENS) * len(routings)
                                                    * 2 * len(GEMMS)),
            "host_us_at_128_tokens": _recorded(_host_us, torch), "summary": _gemm_summary(rows),
            "by_routing": {r: _gemm_summary([x for x in rows if x["routing"] == r])
                           for r in routings}}


def _recorded(fn, *args) -> dict:
    """``fn(*args)``, or the error it raised: the rows measured before it are kept."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"[:300]}


def _gemm_row(torch, row: dict, p, counts, config, tune: bool, l2: int, policy) -> None:
    """One GEMM's times into ``row``: torch._grouped_mm, the pick (the same where it is
    ATen), and with ``tune`` Inductor's max-autotune choice."""
    from cutetune.tuner.kernels.quack_gemm import grouped_kernel
    from cutetune.tuner.measure.grouped import GroupedBuffers
    from cutetune.tuner.measure.timing import time_launches

    buf = GroupedBuffers(p, counts, l2)
    times, err = time_launches(
        lambda a, b, d, cu, offs: torch._grouped_mm(a, b, offs=offs), buf, policy)
    row["aten_ms"], row["aten_err"] = _quantiles(times), err
    row["pick"] = "aten" if config is None else config.short()
    if config is not None:
        kernel = grouped_kernel(config, p.arch, p.ragged)
        times, err = time_launches(lambda a, b, d, cu, offs: kernel(a, b, d, cu), buf, policy)
        row["predicted_ms"], row["predicted_err"] = _quantiles(times), err
    else:
        row["predicted_ms"], row["predicted_err"] = row["aten_ms"], err
    if tune:
        row.update(_max_autotune(torch, buf, policy))
    row["predicted_over_aten"] = row["aten_ms"]["median"] / row["predicted_ms"]["median"]
    if "max_autotune_ms" in row:
        row["predicted_over_max_autotune"] = (row["max_autotune_ms"]["median"]
                                              / row["predicted_ms"]["median"])


def _guarded(row: dict, measure) -> None:
    """``measure()``, its failure (out of memory on the large GEMMs, a kernel's error)
    recorded in ``row`` rather than ending the run; then the GPU memory of its buffers freed
    before the next row's are made."""
    import torch

    try:
        measure()
    except Exception as e:  # noqa: BLE001
        row["error"] = f"{type(e).__name__}: {e}"[:500]
    torch.cuda.empty_cache()


def _gemm_summary(rows) -> dict:
    rows = [r for r in rows if "error" not in r]
    speedups = [r["predicted_over_aten"] for r in rows]
    over_ma = [r["predicted_over_max_autotune"] for r in rows if
               "predicted_over_max_autotune" in r]
    return {"predicted_over_aten_geomean": _geomean(speedups) if speedups else None,
            "predicted_over_aten_min": min(speedups, default=None),
            "predicted_over_max_autotune_geomean": _geomean(over_ma) if over_ma else None,
            "predicted_over_max_autotune_min": min(over_ma, default=None),
            "max_autotune_compile_s": [r["max_autotune_compile_s"] for r in rows
                                       if "max_autotune_compile_s" in r]}


def _geomean(x) -> float:
    return float(math.exp(np.mean(np.log(x))))


def _max_autotune(torch, buf, policy) -> dict:
    """Inductor's max-autotune choice for one grouped GEMM of the buffers' layout: compiled
    alone, its compile (and autotune) seconds, then timed as the others are."""
    from cutetune.tuner.measure.timing import time_launches

    torch._dynamo.reset()
    fn = torch.compile(lambda a, b, offs: torch._grouped_mm(a, b, offs=offs),
                       mode="max-autotune-no-cudagraphs", dynamic=False)
    a, b, _, _, offs = buf.sets[0]
    t0 = time.perf_counter()
    fn(a, b, offs)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    times, err = time_launches(lambda a, b, d, cu, offs: fn(a, b, offs), buf, policy)
    return {"max_autotune_ms": _quantiles(times), "max_autotune_err": err,
            "max_autotune_compile_s": compile_s}


def _host_us(torch) -> dict:
    """Host microseconds to issue one eager call at 128 tokens of DeepSeek-V3's gate+up, with
    the GPU held busy so no call waits on it: torch._grouped_mm, cutetune.grouped_mm, and
    parts of the latter alone: quack's launch of the pick (zero-led offsets made already),
    the offsets' pad, the output's allocation, and the sm90 dynamic scheduler's semaphore."""
    import cutetune
    from cutetune.tuner.kernels.grouped_mm import picker
    from cutetune.tuner.kernels.quack_gemm import grouped_kernel

    layer = MOE_MODELS["deepseek_v3"]
    rows = 128 * layer.top_k
    n, k = expert_projections(layer)["gate_up"]
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(layer.experts, n, k, device="cuda", dtype=torch.bfloat16)
    counts = routing_counts(layer.experts, rows, "skewed")
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    cu, d = torch.nn.functional.pad(offs, (1, 0)), x.new_empty(rows, n)
    config = picker().pick(expert_gemm("fwd", layer.experts, rows, n, k))
    calls = {"aten": lambda: torch._grouped_mm(x, w.mT, offs=offs),
             "cutetune": lambda: cutetune.grouped_mm(x, w.mT, offs),
             "offsets_pad": lambda: torch.nn.functional.pad(offs, (1, 0)),
             "output_empty": lambda: x.new_empty(rows, n),
             "semaphore_zeros": lambda: torch.zeros(1, dtype=torch.int32, device="cuda")}
    out = {"pick": None if config is None else config.short()}
    if config is not None:
        launch = grouped_kernel(config, "sm90", "m")
        calls["quack_launch"] = lambda: launch(x, w.mT, d, cu)
    for name, fn in calls.items():
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        per_call = []
        for _ in range(15):
            torch.cuda._sleep(int(5e6))  # ~2.5 ms of GPU sleep: 50 calls queue behind it
            t0 = time.perf_counter()
            for _ in range(50):
                fn()
            per_call.append((time.perf_counter() - t0) / 50 * 1e6)
            torch.cuda.synchronize()
        out[name] = _quantiles(per_call)
    out["cutetune_minus_aten_us"] = out["cutetune"]["median"] - out["aten"]["median"]
    return out


# ================================================================ the permutation folded in
def gather(args) -> dict:
    import torch

    from cutetune.tuner.measure.timing import TimingPolicy

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    policy = TimingPolicy(warmup=3, min_reps=10, max_reps=50, target_ms=20.0)
    rows, deadline = [], time.time() + args.budget_s
    for model, tokens in itertools.product(args.models.split(","), TOKENS):
        if time.time() > deadline:
            break
        layer = MOE_MODELS[model]
        p = expert_gemm("fwd", layer.experts, tokens * layer.top_k,
                        *expert_projections(layer)["gate_up"])
        row = {"model": model, "tokens": tokens, "problem": p.key()}
        _guarded(row, lambda: _gather_row(torch, row, p, layer.top_k, args.configs, deadline,
                                          l2, policy))
        print(json.dumps(row), flush=True)
        rows.append(row)
    ratios = [r["copy_over_gather"] for r in rows if "copy_over_gather" in r]
    return {"rows": rows, "complete": sum("error" not in r for r in rows)
            == len(args.models.split(",")) * len(TOKENS),
            "copy_over_gather_geomean": _geomean(ratios) if ratios else None,
            "copy_over_gather_min": min(ratios, default=None)}


def _gather_row(torch, row: dict, p, top_k: int, configs: int, deadline: float, l2: int,
                policy) -> None:
    """The up projection ``p`` on rows permuted as a top-``top_k`` routing does, into ``row``:
    the copy then torch._grouped_mm or the pick, against the pick made fit for quack's gather
    and the model's best ``configs`` that quack's gather takes."""
    from quack.gemm_config import config_supports

    from cutetune.tuner.kernels.grouped_mm import picker
    from cutetune.tuner.kernels.quack_gemm import MmPlan, grouped_kernel, launch
    from cutetune.tuner.measure.grouped import GroupedBuffers
    from cutetune.tuner.measure.timing import time_launches

    buf = GroupedBuffers(p, routing_counts(p.experts, p.m, "balanced"), l2)
    g = torch.Generator().manual_seed(p.m // top_k)  # the token count
    idx = (torch.randperm(p.m, generator=g) // top_k).to(torch.int32).cuda()
    buf.gather_rows(idx)
    pick = picker().pick(p)
    row["pick"] = "aten" if pick is None else pick.short()

    def timed(fn, buf=buf) -> dict:
        try:
            times, err = time_launches(fn, buf, policy)
            return {**_quantiles(times), "err": err}
        except Exception as e:  # noqa: BLE001  a failing config is recorded, not fatal
            return {"error": f"{type(e).__name__}: {e}"[:300]}

    row["copy_aten"] = timed(lambda a, b, d, cu, offs: torch._grouped_mm(
        a.index_select(0, idx), b, offs=offs))
    if pick is not None:
        kernel = grouped_kernel(pick, p.arch, "m")
        row["copy_pick"] = timed(lambda a, b, d, cu, offs: kernel(a.index_select(0, idx), b,
                                                                  d, cu))
    # quack's gather rules (config_supports): cluster_n 1, and on sm90 neither the
    # dynamic scheduler nor tile_n 208 (our launch skips quack's own check of them)
    candidates = ([replace(pick, cluster_n=1, is_dynamic_persistent=False)]
                  if pick is not None else []) + [
        c for c in picker().ranked(p, 256)
        if config_supports(c.to_quack(p.arch), gather_A=True, varlen_m=True)][:configs]
    row["gather"] = {}
    for config in dict.fromkeys(candidates):
        if time.time() > deadline or not config_supports(
                config.to_quack(p.arch), gather_A=True, varlen_m=True):
            continue
        plan = MmPlan(config, p.arch)
        row["gather"][config.short()] = timed(
            lambda a, b, d, cu, offs: launch(plan, a, b, d, None, 1.0, 1.0, cu_seqlens_m=cu,
                                             a_idx=idx))
    right = lambda t: t.get("err", 1.0) < 1e-2  # noqa: E731  timed, and the right result
    ok = {c: t["median"] for c, t in row["gather"].items() if right(t)}
    copies = [row[k]["median"] for k in ("copy_aten", "copy_pick") if right(row.get(k, {}))]
    if ok and copies:
        row["gather_best"] = min(ok, key=ok.get)
        row["copy_over_gather"] = min(copies) / ok[row["gather_best"]]


# ================================================================ the MoE block
def moe_block(torch, layer, grouped, device="cuda", dtype=None):
    """The MoE block of ``layer``'s sizes, its parameters made on ``device`` in ``dtype``,
    its expert GEMMs run by ``grouped`` (an attribute: the reference swaps it)."""
    nn, F = torch.nn, torch.nn.functional
    dtype = dtype or torch.bfloat16

    class MoE(nn.Module):
        def __init__(self):
            super().__init__()
            e, h, i = layer.experts, layer.hidden, layer.intermediate
            made = {"device": device, "dtype": dtype}
            self.grouped = grouped
            self.router = nn.Linear(h, e, bias=False, **made)
            self.w13 = nn.Parameter(torch.randn(e, 2 * i, h, **made) * h ** -0.5)
            self.w2 = nn.Parameter(torch.randn(e, h, i, **made) * i ** -0.5)

        def forward(self, x):
            e, top = layer.experts, layer.top_k
            scores = self.router(x).float().softmax(-1)
            weight, expert = scores.topk(top, dim=-1)  # (T, top)
            flat = expert.flatten()
            order = flat.argsort(stable=True)
            counts = torch.zeros(e, dtype=torch.int32, device=x.device).scatter_add_(
                0, flat, torch.ones_like(flat, dtype=torch.int32))
            offs = counts.cumsum(0, dtype=torch.int32)
            token = order // top
            h = self.grouped(x[token], self.w13.mT, offs)
            gate, up = h.chunk(2, dim=-1)
            y = self.grouped(F.silu(gate) * up, self.w2.mT, offs)
            y = y * weight.flatten()[order, None].to(y.dtype)
            return x.new_zeros(x.shape, dtype=y.dtype).index_add_(0, token, y)

    return MoE()


def _fp32_grouped(a, b, offs):
    """torch._grouped_mm's varlen-M form in fp32, expert by expert: the reference."""
    import torch

    bounds = [0, *offs.tolist()]
    out = a.new_empty(a.shape[0], b.shape[-1], dtype=torch.float32)
    for e, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        out[lo:hi] = a[lo:hi].float() @ b[e].float()
    return out


def block_step(torch, module, mode: str, train: bool):
    """``step(x, gy)``: the block's forward (under no_grad) or forward and backward, the
    module compiled as ``mode`` says (eager modes: as it is)."""
    compile_mode = {"default": "default", "predicted": "default", "reduced": "default",
                    "max-autotune": "max-autotune-no-cudagraphs"}.get(mode)
    forward = module if compile_mode is None else torch.compile(module, mode=compile_mode)

    def step(x, gy=None):
        if not train:
            with torch.no_grad():
                return forward(x)
        for p in module.parameters():
            p.grad = None
        y = forward(x)
        y.backward(gy)
        return y

    return step


def block(args) -> dict:
    import torch

    import cutetune

    torch.manual_seed(0)
    layer = MOE_MODELS[args.model]
    grouped = cutetune.grouped_mm if args.mode == "cutetune_eager" else (
        lambda a, b, offs: torch._grouped_mm(a, b, offs=offs))
    module = moe_block(torch, layer, grouped)
    installation = (cutetune.enable(args.mode) if args.mode in ("predicted", "reduced")
                    else None)
    result = {"model": args.model, "mode": args.mode, "layer": layer._asdict(), "phases": {}}
    tokens = [int(t) for t in args.tokens.split(",")]
    for phase in args.phases.split(","):
        torch._dynamo.reset()
        train = phase == "train"
        fn = block_step(torch, module, args.mode, train)
        rows = []
        for t in tokens:
            x = torch.randn(t, layer.hidden, device="cuda", dtype=torch.bfloat16)
            torch._dynamo.maybe_mark_dynamic(x, 0)  # one graph for every token count
            gy = torch.randn_like(x) if train else None
            t0 = time.perf_counter()
            y = fn(x, gy)
            torch.cuda.synchronize()
            row = {"tokens": t, "first_call_s": time.perf_counter() - t0}
            if installation is not None:  # until the compile helper has built the kernels,
                row["helper_wait_s"] = _helper_wait()  # calls run ATen: not timed
            if t == tokens[0]:
                row["rel_err_vs_fp32"] = rel_err_fp32(torch, module, x, y)
            for _ in range(3):
                fn(x, gy)
            torch.cuda.synchronize()
            iters = max(1, min(50, int(0.2 / max(_one(torch, fn, x, gy), 1e-5))))
            times = []
            for _ in range(args.repeats):
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                for _ in range(iters):
                    fn(x, gy)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / iters)
            row["step_ms"] = _quantiles(times)
            row["gpu"] = gpu_kernels(torch, lambda: fn(x, gy), host=True)
            row["routing"] = routing_spread(torch, module, layer, x)
            print(json.dumps({"phase": phase, **row}), flush=True)
            rows.append(row)
        result["phases"][phase] = {"compile_s": rows[0]["first_call_s"], "rows": rows}
    if installation is not None:
        installation.disable()
    return result


def routing_spread(torch, module, layer, x) -> dict:
    """How the block's router spread ``x``'s routed rows over the experts: the largest
    expert's rows over the mean, their coefficient of variation, the share of experts with
    none (the GEMMs' picks assume no routing; ``gemms`` times skewed and balanced ones)."""
    with torch.no_grad():
        expert = module.router(x).float().topk(layer.top_k, dim=-1).indices.flatten()
    counts = torch.bincount(expert, minlength=layer.experts).double()
    mean = counts.mean()
    return {"max_over_mean": float(counts.max() / mean), "cv": float(counts.std() / mean),
            "empty_share": float((counts == 0).double().mean())}


def _helper_wait() -> float:
    """Seconds until the compile helper has built every kernel handed to it."""
    from cutetune.tuner.kernels.helper import SHARED_PREFETCHERS

    t0 = time.perf_counter()
    for helper in SHARED_PREFETCHERS.values():
        helper.wait(timeout=600)
    return time.perf_counter() - t0


def _one(torch, fn, x, gy) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(x, gy)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def rel_err_fp32(torch, module, x, y) -> float:
    """The block's output against the same block with its grouped GEMMs in fp32 (the same
    routing: the router runs as in the mode under test)."""
    grouped, module.grouped = module.grouped, _fp32_grouped
    try:
        with torch.no_grad():
            ref = module(x).float()
    finally:
        module.grouped = grouped
    return float(torch.linalg.vector_norm(y.detach().float() - ref) / torch.linalg.vector_norm(ref))


# ================================================================ every mode, fresh processes
def run(args) -> None:
    """Each (model, mode) in a fresh process with cold Inductor and Triton caches. quack's
    kernel cache is cold for each model's first mode (predicted, whose compile time is a
    target); the model's later modes share it."""
    os.makedirs(args.out, exist_ok=True)
    start = time.time()
    blocks_deadline = start + args.budget_s - args.gemms_s
    blocks = []
    with tempfile.TemporaryDirectory() as quack_caches:
        for mode in args.modes.split(","):  # every model's mode before the next mode
            for model in MODELS:
                left = blocks_deadline - time.time()
                if left < 30:
                    print(f"skipped {model} {mode}: out of time", flush=True)
                    blocks.append({"model": model, "mode": mode, "error": "out of time"})
                    continue
                blocks.append(_block_process(args, model, mode, f"{quack_caches}/{model}",
                                             left))
    with open(os.path.join(args.out, "moe_block_h200.json"), "w") as f:
        json.dump({"command": " ".join(sys.argv),
                   "device": next((b["device"] for b in blocks if "device" in b), None),
                   "blocks": blocks,
                   "speedups": _speedups(blocks)}, f, indent=1)
    try:  # the GPU hosts have no matplotlib: plot the file elsewhere then
        plot(os.path.join(args.out, "moe_block_h200.json"),
             os.path.join(args.out, "moe_block_h200.png"))
    except Exception as e:  # noqa: BLE001  (the GEMMs still run)
        print(f"no plot ({type(e).__name__}: {e}): run `bench_moe.py plot` on the block file",
              flush=True)
    left = start + args.budget_s - time.time()
    if args.gemms_s > 0 and left > 60:
        gemm_args = argparse.Namespace(max_autotune=args.max_autotune, budget_s=left - 30,
                                       models=",".join(MODELS), routings=args.routings)
        with open(os.path.join(args.out, "moe_gemms_h200.json"), "w") as f:
            json.dump({"command": " ".join(sys.argv), "device": _device(), **gemms(gemm_args)},
                      f, indent=1)


def _block_process(args, model: str, mode: str, quack_cache: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor",
               "QUACK_CACHE_DIR": quack_cache, "CUTETUNE_CACHE": f"{cache}/ct",
               "TRITON_CACHE_DIR": f"{cache}/triton", "PYTHONUNBUFFERED": "1"}
        out = f"{cache}/block.json"
        cmd = [sys.executable, __file__, "block", "--model", model, "--mode", mode,
               "--out", out, "--tokens", args.tokens, "--phases", args.phases]
        t0 = time.time()
        try:
            subprocess.run(cmd, env=env, timeout=timeout, check=True)
            with open(out) as f:
                return {**json.load(f), "process_s": time.time() - t0}
        except (subprocess.SubprocessError, OSError) as e:
            print(f"{model} {mode} failed: {e}", flush=True)
            return {"model": model, "mode": mode, "error": str(e)}


def _speedups(blocks) -> dict:
    """Per model and phase: each mode's step against default's (>1: faster), by token count
    and geomean, and compile seconds beside default's."""
    by = {(b["model"], b["mode"]): b for b in blocks if "phases" in b}
    out = {}
    for (model, mode), b in by.items():
        base = by.get((model, "default"))
        if base is None or mode == "default":
            continue
        for phase, res in b["phases"].items():
            if phase not in base["phases"]:
                continue
            ref = {r["tokens"]: r["step_ms"]["median"] for r in base["phases"][phase]["rows"]}
            ratios = {r["tokens"]: ref[r["tokens"]] / r["step_ms"]["median"]
                      for r in res["rows"] if r["tokens"] in ref}
            out[f"{model}/{phase}/{mode}"] = {
                "over_default": ratios, "geomean": _geomean(list(ratios.values())),
                "compile_s": res["compile_s"],
                "default_compile_s": base["phases"][phase]["compile_s"]}
    return out


def plot(path: str, out: str) -> None:
    """The figure of a ``run``'s block file ``path`` (see the module doc), written to ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path) as f:
        blocks = [b for b in json.load(f)["blocks"] if "phases" in b]
    panels = sorted({(b["model"], phase) for b in blocks for phase in b["phases"]})
    if not panels:
        raise ValueError(f"{path} holds no block that ran")
    fig, axes = plt.subplots(2, len(panels), figsize=(4.5 * len(panels), 8), squeeze=False)
    for col, (model, phase) in enumerate(panels):
        runs = {b["mode"]: b["phases"][phase]["rows"] for b in blocks
                if b["model"] == model and phase in b["phases"]}
        base = {r["tokens"]: r["step_ms"]["median"] for r in runs.get("default", [])}
        for mode, rows in runs.items():
            tokens = [r["tokens"] for r in rows]
            ms = [r["step_ms"] for r in rows]
            med = np.array([m["median"] for m in ms])
            bars = [med - [m["p20"] for m in ms], [m["p80"] for m in ms] - med]
            color = f"C{MODES.index(mode)}" if mode in MODES else None
            axes[0, col].errorbar(tokens, med, yerr=bars, marker="o", capsize=2, label=mode,
                                  color=color)
            shared = [t for t in tokens if t in base]
            if mode != "default" and shared:
                axes[1, col].plot(shared, [base[t] / med[tokens.index(t)] for t in shared],
                                  marker="o", label=mode, color=color)
        axes[0, col].set(title=f"{model}, {phase}: step time", xscale="log", yscale="log",
                         xlabel="tokens per step", ylabel="ms")
        axes[1, col].axhline(1.0, color="grey", lw=0.8)
        axes[1, col].set(title=f"{model}, {phase}: speedup over default", xscale="log",
                         xlabel="tokens per step", ylabel="default / mode")
        for ax in axes[:, col]:
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(os.path.basename(path), fontsize=9)
    fig.tight_layout()
    save_png(fig, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gemms")
    g.add_argument("--out", required=True)
    g.add_argument("--max-autotune", type=int, default=8)
    g.add_argument("--budget-s", type=float, default=300)
    g.add_argument("--models", default=",".join(MODELS))
    g.add_argument("--routings", default="skewed,balanced")
    b = sub.add_parser("block")
    b.add_argument("--model", choices=MODELS, required=True)
    b.add_argument("--mode", choices=MODES, required=True)
    b.add_argument("--out", required=True)
    b.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    b.add_argument("--phases", default="fwd,train")
    b.add_argument("--repeats", type=int, default=15)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--budget-s", type=float, default=480)
    r.add_argument("--modes", default="predicted,default,reduced,max-autotune,cutetune_eager,eager")
    r.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    r.add_argument("--phases", default="fwd,train")
    r.add_argument("--max-autotune", type=int, default=8)
    r.add_argument("--routings", default="skewed,balanced")
    r.add_argument("--gemms-s", type=float, default=150,
                   help="seconds of the budget kept for the GEMMs (0: none)")
    ga = sub.add_parser("gather")
    ga.add_argument("--out", required=True)
    ga.add_argument("--configs", type=int, default=3)
    ga.add_argument("--budget-s", type=float, default=300)
    ga.add_argument("--models", default=",".join(MODELS))
    pl = sub.add_parser("plot")
    pl.add_argument("file", help="a run's moe_block_h200.json")
    pl.add_argument("--out", help="the figure (default: FILE with .png)")
    args = ap.parse_args()
    if args.cmd == "run":
        return run(args)
    if args.cmd == "plot":
        return plot(args.file, args.out or os.path.splitext(args.file)[0] + ".png")
    res = {"gemms": gemms, "gather": gather, "block": block}[args.cmd](args)
    with open(args.out, "w") as f:
        json.dump({"command": " ".join(sys.argv), "device": _device(), **res}, f, indent=1)


def _device() -> str:
    import torch

    return torch.cuda.get_device_name()


if __name__ == "__main__":
    main()
