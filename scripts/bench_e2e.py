#!/usr/bin/env python
"""End-to-end torch.compile benchmark of cutetune's Inductor integration on one GPU.

Workloads (bf16, Llama-3-8B shapes): the decoder MLP (gate/up 4096->14336, down 14336->4096)
and the attention projections (q 4096->4096, k/v 4096->1024, o 4096->4096) at each M.
Modes: Inductor's default, max-autotune (GEMM backends ATEN,TRITON, no CUDA graphs), cutetune
predicted and cutetune reduced. Every measurement runs in a fresh process with an empty
Inductor cache (TORCHINDUCTOR_CACHE_DIR); cutetune modes run twice, with empty kernel caches
(cold: QUACK_CACHE_DIR, CUTE_DSL_CACHE_DIR, CUTETUNE_CACHE, where cutetune keeps the fused
kernels' TVM-FFI libraries, and CUTETUNE_TEMPLATE_CACHE_DIR, where it keeps the Triton template
kernels it chose) and with those caches as the cold run left them (warm). Reported per
workload: compile wall time (from ``enable()`` to the first call's result, so it includes
quack's import when the process's first quack kernel is launched then, and the start of
reduced mode's compile workers), steady-state time per call (CUDA events,
median of repeats), relative error against eager (of the first call, and of a call after the
timing: a fused kernel may take over from ATen in between), and which kernels the GEMMs got.
Also the host overhead of one tiny GEMM launch: torch.mm vs cutetune's launcher.

  python scripts/bench_e2e.py --out data/bench/e2e_h200.json [--quick] [--heuristics H.json]
  python scripts/bench_e2e.py --cpu-only   # heuristics load/lookup timing, no GPU
  python scripts/bench_e2e.py --merge a.json b.json --out e2e.json   # parts run apart
  python scripts/bench_e2e.py --ms 1 16 --modes default predicted --rounds 3   # medians

With --rounds N every (M, mode, kernel cache) runs N times, the rounds one after another so
that a drift of the host hits every mode alike; a check compares the runs of one round and
takes the median over rounds (one fresh process's compile time differed from the next by up to
4 s at M <= 16 on one host: data/bench/e2e_h200_1gpu_small5.json.gz, default at M 16 and 1).

The GPU run keeps to --budget-s (default 460 s): a measurement whose expected duration would
cross it is skipped and recorded as such.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import (HIDDEN, INTER, KV, LIMITS, geomean_check, kernel_counts, limit_check,
                      rel_err, save_png, time_calls, workload_classes)

REPO = Path(__file__).resolve().parent.parent
MS = (1, 16, 128, 1024, 4096, 8192)
QUICK_MS = (16, 4096)
MODES = ("default", "max-autotune", "predicted", "reduced")
# Guesses of a run's duration (s) before one of its kind has been seen; then the longest seen.
GUESS_S = {"default": 30, "max-autotune": 90, "predicted": 45, "reduced": 90}
ENABLE_FROM = ("cutetune", "cutetune.tuner.inductor.choices")  # the module whose enable() is called


# ================================================================ worker (one fresh process)
class _LogTimes(logging.Handler):
    """Keeps cutetune's launcher messages (quack's import time, each kernel's first launch,
    also of the fused SwiGLU kernel), the fusion pass's, the Inductor integration's (each
    node's decision, the waits for the compile helper) and the prefetcher's (the helper's
    fork) with their time since the last ``restart()``."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.restart()
        for name in ("cutetune.tuner.kernels.launcher", "cutetune.tuner.kernels.swiglu",
                     "cutetune.tuner.inductor.passes", "cutetune.tuner.inductor.choices",
                     "cutetune.tuner.kernels.helper"):
            logger = logging.getLogger(name)
            logger.setLevel(logging.INFO)
            logger.addHandler(self)

    def restart(self) -> None:
        self.t0, self.events = time.perf_counter(), []

    def emit(self, record: logging.LogRecord) -> None:
        self.events.append([round(time.perf_counter() - self.t0, 3), record.getMessage()])


def watch_first_import(name: str) -> dict:
    """Keep, under "by", where module ``name`` is first imported in this process (the last
    frames outside the import system): a quack import the compile should not have made names
    its culprit. An audit hook, so it stays for the process's life (one worker's)."""
    import traceback

    seen: dict = {}

    def hook(event: str, args: tuple) -> None:
        if event == "import" and args[0] == name and "by" not in seen:
            frames = [f for f in traceback.extract_stack()[:-1]
                      if "importlib" not in f.filename and "<frozen" not in f.filename]
            seen["by"] = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames[-6:]]

    sys.addaudithook(hook)
    return seen


def worker(spec: dict) -> dict:
    import contextlib

    import importlib

    import torch

    t_start = time.perf_counter()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    x = torch.randn(spec["m"], HIDDEN, device=dev, dtype=torch.bfloat16)
    mode = spec["mode"]
    options = None
    if mode == "max-autotune":
        options = {"max_autotune": True, "max_autotune_gemm_backends": "ATEN,TRITON"}
    results = {}
    log_times = _LogTimes()
    quack_import = watch_first_import("quack")
    for name, cls in workload_classes(torch).items():
        module = cls().to(dev, torch.bfloat16).eval()
        with torch.no_grad():
            ref = module(x)  # eager: also initializes cuBLAS before the compile is timed
            torch.cuda.synchronize()
            quack_before = "quack" in sys.modules
            log_times.restart()
            # Timed from enable(): a user pays what it starts (the reduced-mode compile
            # workers), Inductor's import in the process's first compile (after enable(), as
            # in a script that enables cutetune before it compiles) and, in the first that
            # launches a quack kernel, quack's.
            t0 = time.perf_counter()
            ctx = contextlib.nullcontext()
            if mode in ("predicted", "reduced"):
                enable = importlib.import_module(spec.get("enable_from", ENABLE_FROM[0])).enable
                ctx = enable(mode, top_k=spec.get("top_k"), model=spec.get("heuristics"))
            from torch._inductor.utils import run_and_get_code

            compiled = torch.compile(module, options=options)
            with ctx:
                out, code = run_and_get_code(compiled, x)
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
            phases = _compile_phases()  # run_and_get_code reset Dynamo, and its phase times
            prefetched = _prefetch_stats(wait=False)
            t0 = time.perf_counter()
            helper = _prefetch_stats(wait=True)  # steady state: no background compile running
            helper_wait_s = time.perf_counter() - t0
            step = time_calls(torch, compiled, x, spec["repeats"])
            steady = compiled(x)
            eager = time_calls(torch, module, x, spec["repeats"])
        results[name] = {"compile_s": compile_s, "compile_phases_s": phases,
                         "step_ms": step["median"],
                         "step_ms_p20": step["p20"], "step_ms_p80": step["p80"],
                         "eager_ms": eager["median"],
                         "step_host_ms": step["host"], "eager_host_ms": eager["host"],
                         "step_cpu": step["cpu"], "launcher_log": log_times.events,
                         "rel_err": rel_err(torch, out, ref),
                         "rel_err_steady": rel_err(torch, steady, ref),
                         "fused_via": _fused_via(),
                         "kernels": kernel_counts("\n".join(code)),
                         "quack_imported": not quack_before and "quack" in sys.modules,
                         "quack_imported_by": None if quack_before else quack_import.get("by"),
                         "prefetched": prefetched, "helper_wait_s": helper_wait_s,
                         "helper_after_wait": helper,
                         "template_kernels_cached": _templates_cached()}
        if spec.get("save_code"):
            rnd = f"_r{spec['round']}" if spec.get("round") else ""
            fname = f"m{spec['m']}_{mode}_{spec.get('kernel_cache') or 'none'}{rnd}_{name}.py"
            Path(spec["save_code"], fname).write_text("\n\n# ----\n".join(code))
        del module, compiled
        torch.cuda.empty_cache()
    return {"workloads": results, "process_s": time.perf_counter() - t_start}


def _compile_phases(floor_s: float = 1e-3) -> dict[str, float]:
    """Seconds spent in each phase Dynamo and Inductor time (``dynamo_timed``: tracing,
    AOTAutograd, lowering, codegen, loading the module and waiting on its kernels) since
    Dynamo's last reset, those over ``floor_s``: where a compile's time went, in every mode
    alike, cutetune's or not."""
    from torch._dynamo.utils import compile_times

    names, values = compile_times(repr="csv", aggregate=True)
    return {n: round(float(v), 4) for n, v in zip(names, values) if float(v) > floor_s}


def _fused_via() -> list | None:
    """What the fused SwiGLU calls ran through once timed (``swiglu.launched_via``: "library",
    "quack"; None for ATen), or None outside cutetune's modes. The first call may have run
    ATen while the compile helper built the kernel."""
    if "cutetune.tuner.kernels.swiglu" not in sys.modules:
        return None
    from cutetune.tuner.kernels import swiglu

    vias = sorted({str(p.via) for p in swiglu._plans.values()})
    swiglu._plans.clear()  # the next workload's calls start afresh
    return vias


def _templates_cached() -> int | None:
    """Template kernels in cutetune's template cache (None outside cutetune's modes): equal
    after the cold and the warm run when the warm one compiled none."""
    if "cutetune.tuner.inductor.template_cache" not in sys.modules:
        return None
    from cutetune.tuner.inductor.template_cache import stored_templates

    return stored_templates()


def _prefetch_stats(wait: bool) -> dict | None:
    """Kernels the compile helper was sent so far in this process, by state, with its
    timeline (``KernelPrefetcher.timeline``); with ``wait``, once none is pending."""
    if "cutetune.tuner.kernels.helper" not in sys.modules:
        return None
    from cutetune.tuner.kernels.helper import SHARED_PREFETCHERS

    return {arch: {**(pf.wait(timeout=300) if wait else pf.stats()),
                   "timeline": list(pf.timeline)}
            for arch, pf in SHARED_PREFETCHERS.items()} or None


def overhead_worker(spec: dict) -> dict:
    """Host cost of launching a tiny GEMM: the issuing loop without a sync (host us/call) and
    with one (wall us/call), for torch.mm, torch.mm again once quack is imported, cutetune's
    launcher with a fixed config, and torch.mm once more: whether quack's import or launches
    slow down the host side of everything after them (on the H200 they did not: 16.2, 11.2 and
    10.0 us for torch.mm in data/bench/e2e_h200_1gpu.json.gz)."""
    import torch

    from cutetune.space.config import quack_default_config
    from cutetune.tuner.kernels.launcher import quack_mm_out
    from cutetune.tuner.kernels.quack_gemm import import_quack
    from cutetune.tuner.kernels.problems import config_tuple, device_arch

    m = n = k = spec["size"]
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    cfg = config_tuple(quack_default_config(device_arch(a.device) or "sm90"))
    mm = lambda: torch.mm(a, b, out=out)  # noqa: E731
    steps = (("torch.mm", None, mm), ("torch.mm after quack import", import_quack, mm),
             ("cutetune.quack_mm_out", None, lambda: quack_mm_out(a, b, out, cfg)),
             ("torch.mm after quack", None, mm))
    res = {"size": m, "config": list(cfg)}
    for name, before, fn in steps:
        if before is not None:
            t0 = time.perf_counter()
            before()
            res[f"{before.__name__}_s"] = time.perf_counter() - t0
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        host, wall = [], []
        for _ in range(spec["repeats"]):
            t0 = time.perf_counter()
            for _ in range(spec["calls"]):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            host.append((t1 - t0) / spec["calls"] * 1e6)
            wall.append((t2 - t0) / spec["calls"] * 1e6)
        res[name] = {"host_us": statistics.median(host), "wall_us": statistics.median(wall)}
    torch.testing.assert_close(out, torch.mm(a, b), rtol=2e-2, atol=2e-2)
    res["launcher_minus_torch_host_us"] = (res["cutetune.quack_mm_out"]["host_us"]
                                           - res["torch.mm"]["host_us"])
    res["torch_after_quack_minus_before_host_us"] = (res["torch.mm after quack"]["host_us"]
                                                     - res["torch.mm"]["host_us"])
    return res


# ================================================================ orchestrator
def _run_worker(spec: dict, env: dict, timeout: float) -> dict:
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], env=env,
                           cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "wall_s": time.perf_counter() - t0}
    wall = time.perf_counter() - t0
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"status": "error", "wall_s": wall, "error": (p.stderr or p.stdout)[-2000:]}
    return {"status": "ok", "wall_s": wall, **json.loads(lines[-1])}


def _env(inductor_dir: Path, kernel_dir: Path | None, prebuilt: bool = True) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TORCHINDUCTOR_", "CUTETUNE_"))
           and k not in ("TRITON_CACHE_DIR", "TRITON_CACHE_MANAGER")}
    if not prebuilt:
        env["CUTETUNE_FUSED_KERNELS"] = ""  # a cold cache then builds every fused kernel
    env.update(TORCHINDUCTOR_CACHE_DIR=str(inductor_dir), PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    if kernel_dir is not None:
        env.update(QUACK_CACHE_DIR=str(kernel_dir / "quack"),
                   CUTE_DSL_CACHE_DIR=str(kernel_dir / "cute_dsl"),
                   CUTETUNE_CACHE=str(kernel_dir / "cutetune"),
                   CUTETUNE_TEMPLATE_CACHE_DIR=str(kernel_dir / "triton_templates"))
    return env


def run_gpu(args) -> dict:
    from cutetune.models.heuristics import Heuristics, PackagedHeuristics

    heuristics = str(Path(args.heuristics).resolve()) if args.heuristics else None
    if heuristics:
        digest = Heuristics.load(heuristics).digest
    else:
        digest = PackagedHeuristics().digest  # raises with instructions when none is shipped
    ms = QUICK_MS if args.quick else tuple(args.ms)
    repeats = 10 if args.quick else 20
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="cutetune_e2e_"))
    res = {"meta": {"argv": sys.argv[1:], "quick": args.quick, "ms": list(ms),
                    "modes": list(args.modes), "warm_for": list(args.warm_for),
                    "repeats": repeats, "budget_s": args.budget_s,
                    "heuristics": args.heuristics or "packaged", "heuristics_digest": digest,
                    "top_k": args.top_k, "prebuilt_kernels": not args.no_prebuilt_kernels,
                    "enable_from": args.enable_from, "rounds": args.rounds,
                    "started": time.time()},
           "runs": []}
    seen_s: dict[str, float] = {}

    def left() -> float:
        return args.budget_s - (time.perf_counter() - started)

    if not args.skip_overhead:
        ov = _run_worker({"kind": "overhead", "size": 64, "calls": 500, "repeats": 7},
                         _env(tmp / "ov_inductor", tmp / "ov_kernels"), timeout=max(left(), 1))
        res["launch_overhead"] = ov
        print(f"launch overhead: {json.dumps(ov)}", flush=True)
    try:
        for rnd, m, mode in itertools.product(range(args.rounds), ms, args.modes):
            caches = ((("cold", "warm") if mode in args.warm_for else ("cold",))
                      if mode in ("predicted", "reduced") else (None,))
            kernel_dir = tmp / f"kernels_{mode}_{m}_r{rnd}"
            for cache in caches:
                kind = mode + (f"-{cache}" if cache else "")
                run = {"mode": mode, "m": m, "kernel_cache": cache, "round": rnd}
                guess = seen_s.get(kind, GUESS_S[mode] / (2 if cache == "warm" else 1))
                cold = res["runs"][-1] if cache == "warm" else None
                if cold is not None and cold["status"] != "ok":
                    run.update(status="skipped", reason="its cold run did not run, so "
                               "the kernel cache is not warm")
                elif guess > left():
                    run.update(status="skipped", reason=f"budget: ~{guess:.0f} s needed, "
                               f"{max(left(), 0):.0f} s left")
                else:
                    spec = {"kind": "compile", "mode": mode, "m": m, "repeats": repeats,
                            "heuristics": heuristics, "top_k": args.top_k,
                            "enable_from": args.enable_from,
                            "kernel_cache": cache, "round": rnd,
                            "save_code": args.save_code}
                    inductor_dir = Path(tempfile.mkdtemp(dir=tmp, prefix="inductor_"))
                    run.update(_run_worker(spec, _env(inductor_dir,
                                                      kernel_dir if cache else None,
                                                      not args.no_prebuilt_kernels),
                                           timeout=left()))
                    seen_s[kind] = max(seen_s.get(kind, 0.0), run["wall_s"])
                    shutil.rmtree(inductor_dir, ignore_errors=True)
                res["runs"].append(run)
                print(_run_line(run), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res["meta"]["total_s"] = time.perf_counter() - started
    return res


def merge(parts: list[dict]) -> dict:
    """One result from several runs of this script with the same heuristics: runs by M
    ascending, where a run (mode, M, kernel cache, round) measured in a later part replaces the same
    run of an earlier part (a re-run of what was skipped); meta of each part kept, launch
    overhead from the first part that measured it."""
    digests = {p["meta"]["heuristics_digest"] for p in parts}
    if len(digests) != 1:
        raise SystemExit(f"--merge: the parts used different heuristics ({sorted(digests)})")
    meta = {**parts[0]["meta"], "ms": sorted({m for p in parts for m in p["meta"]["ms"]}),
            "total_s": sum(p["meta"]["total_s"] for p in parts),
            "parts": [p["meta"] for p in parts]}
    latest = {(r["mode"], r["m"], r["kernel_cache"], r.get("round", 0)): r
              for p in parts for r in p["runs"]}
    runs = sorted(latest.values(), key=lambda r: r["m"])
    overhead = next((p["launch_overhead"] for p in parts if "launch_overhead" in p), None)
    return {"meta": meta, "runs": runs, "launch_overhead": overhead}


def _run_line(run: dict) -> str:
    head = f"M={run['m']:>5} {run['mode']:>12} {run['kernel_cache'] or '':>4}: {run['status']}"
    if run["status"] != "ok":
        return head + f" {run.get('reason') or run.get('error', '')[-300:]}"
    parts = [f"{n} compile {w['compile_s']:.1f}s step {w['step_ms'] * 1e3:.1f}us "
             f"err {w['rel_err']:.1e} {w['kernels']}" for n, w in run["workloads"].items()]
    return head + f" ({run['wall_s']:.0f}s) | " + " | ".join(parts)


def _values(res: dict, wl: str, key: str):
    """``value(mode, m, kernel_cache, rnd=None)``: workload ``wl``'s ``key`` in that run of
    round ``rnd`` (None: the median over the rounds that ran it), or None when none ran."""
    ok: dict[tuple, dict[int, float]] = {}
    for r in res["runs"]:
        if r["status"] == "ok":
            ok.setdefault((r["mode"], r["m"], r["kernel_cache"]), {})[r.get("round", 0)] = \
                r["workloads"][wl][key]

    def value(mode, m, cache=None, rnd=None):
        by_round = ok.get((mode, m, cache), {})
        if rnd is not None:
            return by_round.get(rnd)
        return statistics.median(by_round.values()) if by_round else None

    return value


def _rounds(res: dict) -> list[int]:
    return sorted({r.get("round", 0) for r in res["runs"]})


def rounds_check(by_m_rounds: dict, limit: float) -> dict:
    """``limit_check`` of each M's median over rounds (``by_m_rounds``: M -> the value of each
    round that measured both sides), with the rounds' values where there were several."""
    out = limit_check({m: statistics.median(v) for m, v in by_m_rounds.items()}, limit)
    if any(len(v) > 1 for v in by_m_rounds.values()):
        out["by_m_rounds"] = by_m_rounds
    return out


def targets(res: dict) -> dict:
    """The issue's targets, checked per workload on the runs present (a missing run leaves
    its check out; ``checked`` counts what was compared):
      predicted: compile at most 2 s (cold kernels) / 0.5 s (warm) over default's; step time
        at most 1 % over the better of default and max-autotune at every M; geomean step
        time over M >= 1024 at least 3 % under that better one;
      reduced: compile no slower than max-autotune (cold kernels and warm); step time no
        slower than predicted's (cold runs), within the same 1 % as predicted's step target
        (two runs of identical kernels differ by about that much)."""
    out = {}
    for wl in ("mlp", "attn"):
        compile_s, step_ms = _values(res, wl, "compile_s"), _values(res, wl, "step_ms")
        checks: dict[str, dict] = {k: {} for k in (
            "predicted_compile_cold_over_default_s", "predicted_compile_warm_over_default_s",
            "predicted_step_over_best_ratio", "reduced_compile_cold_over_max_autotune_s",
            "reduced_compile_warm_over_max_autotune_s", "reduced_step_over_predicted_ratio")}

        def add(check: str, m: int, v: float) -> None:
            checks[check].setdefault(m, []).append(v)

        for m, rnd in itertools.product(res["meta"]["ms"], _rounds(res)):
            d_c, ma_c = compile_s("default", m, rnd=rnd), compile_s("max-autotune", m, rnd=rnd)
            steps = [v for v in (step_ms("default", m, rnd=rnd),
                                 step_ms("max-autotune", m, rnd=rnd)) if v]
            p_step = step_ms("predicted", m, "cold", rnd)
            for cache in ("cold", "warm"):
                pc, rc = (compile_s(mo, m, cache, rnd) for mo in ("predicted", "reduced"))
                if pc is not None and d_c is not None:
                    add(f"predicted_compile_{cache}_over_default_s", m, pc - d_c)
                if rc is not None and ma_c is not None:
                    add(f"reduced_compile_{cache}_over_max_autotune_s", m, rc - ma_c)
            if p_step and len(steps) == 2:
                add("predicted_step_over_best_ratio", m, p_step / min(steps))
            r_step = step_ms("reduced", m, "cold", rnd)
            if r_step and p_step:
                add("reduced_step_over_predicted_ratio", m, r_step / p_step)
        res_wl = {k: rounds_check(v, LIMITS[k]) for k, v in checks.items()}
        big = [v for m, v in res_wl["predicted_step_over_best_ratio"]["by_m"].items()
               if m >= 1024]
        res_wl["predicted_step_geomean_m_ge_1024_over_best"] = geomean_check(
            big, LIMITS["predicted_step_geomean_m_ge_1024_over_best"])
        out[wl] = res_wl
    return out


# Where a compile's seconds go (``compile_phases_s``): Dynamo's whole compile of the graph,
# and within it the wait for the compiled module's kernels (Triton's, templates among them).
SPLIT_PHASES = {"dynamo_s": "_compile.compile_inner", "kernels_s": "PyCodeCache.load_by_key_path"}


def compile_split(res: dict) -> dict:
    """Per workload, mode (with its kernel cache) and M, medians over rounds of the compile's
    seconds inside Dynamo's compile, waiting on its kernels, and outside Dynamo (``enable()``,
    Inductor's import in the process's first compile, the first call): which part of a
    difference between modes is cutetune's lowering and kernels, and which is not."""
    out: dict = {}
    for r in res["runs"]:
        if r["status"] != "ok":
            continue
        kind = r["mode"] + (f"-{r['kernel_cache']}" if r["kernel_cache"] else "")
        for wl, w in r["workloads"].items():
            phases = w.get("compile_phases_s")
            if phases is None:
                continue
            split = {k: phases.get(name, 0.0) for k, name in SPLIT_PHASES.items()}
            split["outside_s"] = w["compile_s"] - split["dynamo_s"]
            cell = out.setdefault(wl, {}).setdefault(kind, {}).setdefault(str(r["m"]), {})
            for k, v in split.items():
                cell.setdefault(k, []).append(v)
    return {wl: {kind: {m: {k: round(statistics.median(v), 3) for k, v in cell.items()}
                        for m, cell in by_m.items()} for kind, by_m in kinds.items()}
            for wl, kinds in out.items()}


def split_lines(split: dict) -> str:
    lines = ["\ncompile seconds, medians over rounds: inside Dynamo (of it, waiting on kernels) "
             "+ outside"]
    for wl, kinds in split.items():
        for kind, by_m in kinds.items():
            cells = [f"M={m}: {c['dynamo_s']:.2f} ({c['kernels_s']:.2f}) + {c['outside_s']:.2f}"
                     for m, c in by_m.items()]
            lines.append(f"  {wl:4} {kind:14} " + " | ".join(cells))
    return "\n".join(lines)


def targets_lines(t: dict) -> str:
    lines = ["\ntargets (met / checked M values; a value above its limit misses):"]
    for wl, checks in t.items():
        for k, c in checks.items():
            worst = (max(c["by_m"].values()) if c.get("by_m") else c.get("value"))
            w = "-" if worst is None else f"{worst:.3f}"
            lines.append(f"  {wl:4} {k:45} limit {c['limit']:>5}  worst {w:>7}  "
                         f"met {c['met']} ({c['checked']} checked)")
    lines.append("  (the step checks compare fresh processes, whose host-bound steps differ beyond "
                 "their kernels: judge them with scripts/step_ab.py --report)")
    return "\n".join(lines)


def ratio_table(res: dict) -> str:
    """Per workload and M: step time against Inductor's default, and compile seconds (medians
    over rounds)."""
    lines = []
    for wl in ("mlp", "attn"):
        compile_s, step_ms = _values(res, wl, "compile_s"), _values(res, wl, "step_ms")
        lines.append(f"\n{wl}: step-time ratio to default (lower is faster) | compile s "
                     f"(default / max-autotune / predicted cold,warm / reduced cold,warm)")
        lines.append(f"{'M':>5} {'default us':>10} {'max-at':>7} {'pred':>7} {'red':>7} | "
                     f"{'def':>5} {'m-at':>5} {'pred':>11} {'red':>11}")
        for m in res["meta"]["ms"]:
            base = step_ms("default", m)
            ratio = lambda v: f"{v / base:7.2f}" if v and base else f"{'-':>7}"  # noqa: E731
            sec = lambda v: f"{v:5.1f}" if v is not None else f"{'-':>5}"  # noqa: E731
            step = {mo: step_ms(mo, m, "cold" if mo in ("predicted", "reduced") else None)
                    for mo in MODES}
            comp = {(mo, c): compile_s(mo, m, c) for mo in MODES
                    for c in (("cold", "warm") if mo in ("predicted", "reduced") else (None,))}
            base_us = f"{base * 1e3:10.1f}" if base else f"{'-':>10}"
            lines.append(
                f"{m:>5} {base_us} "
                f"{ratio(step['max-autotune'])} {ratio(step['predicted'])} {ratio(step['reduced'])}"
                f" | {sec(comp[('default', None)])} {sec(comp[('max-autotune', None)])} "
                f"{sec(comp[('predicted', 'cold')])},{sec(comp[('predicted', 'warm')])} "
                f"{sec(comp[('reduced', 'cold')])},{sec(comp[('reduced', 'warm')])}")
    return "\n".join(lines)


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for col, wl in enumerate(("mlp", "attn")):
        step_ms, compile_s = _values(res, wl, "step_ms"), _values(res, wl, "compile_s")
        for mode in MODES:
            for cache, style in ((None, "-"), ("cold", "-"), ("warm", "--")):
                ms = [m for m in sorted(res["meta"]["ms"]) if step_ms(mode, m, cache) is not None]
                if not ms:
                    continue
                label = mode + (f" ({cache} kernels)" if cache else "")
                if cache != "warm":
                    axes[0, col].plot(ms, [step_ms(mode, m, cache) * 1e3 for m in ms],
                                      style, marker="o", label=mode)
                axes[1, col].plot(ms, [compile_s(mode, m, cache) for m in ms], style,
                                  marker="o", label=label)
        axes[0, col].set(title=f"{wl}: steady-state time per call (median over rounds)", xscale="log", yscale="log",
                         xlabel="M (tokens)", ylabel="us")
        axes[1, col].set(title=f"{wl}: compile wall time (fresh process, empty Inductor cache)",
                         xscale="log", yscale="log", xlabel="M (tokens)", ylabel="s")
        for ax in axes[:, col]:
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path)


# ================================================================ CPU: heuristics timing
def run_cpu(args) -> dict:
    from cutetune.models.triton_mm import config_key
    from cutetune.space.problem import GemmProblem
    from cutetune.models import heuristics as hz
    from cutetune.models.triton_mm import QUACK_LAUNCH_HOST_US
    from cutetune.tuner.inductor.decisions import (REDUCED_TOP_K, by_m_table, decide,
                                                   decide_swiglu, triton_candidates)
    from cutetune.tuner.kernels.launcher import m_ranges

    if args.heuristics:
        path, source = Path(args.heuristics), "given file"
    else:
        path, source = hz.default_path("sm90", "bf16"), "packaged file"
    loads = []  # the first is the one a compile pays (nothing of the file cached in-process)
    for _ in range(20):
        t0 = time.perf_counter()
        h = hz.Heuristics.load(path)
        loads.append((time.perf_counter() - t0) * 1e3)
    llama = [GemmProblem(m, n, k, b_major="k") for m in MS
             for n, k in ((INTER, HIDDEN), (HIDDEN, INTER), (HIDDEN, HIDDEN), (KV, HIDDEN))]
    odd = [GemmProblem(m, n, k) for m in (3, 77, 1500, 30000) for n in (200, 3000)
           for k in (72, 9000)]
    probs = llama + odd
    per_call = {}
    for name, fn in (("lookup_us", h.lookup),
                     ("decide_predicted_us",
                      lambda p: decide(p, "predicted", h, 1, QUACK_LAUNCH_HOST_US)),
                     ("decide_reduced_us",
                      lambda p: decide(p, "reduced", h, REDUCED_TOP_K, QUACK_LAUNCH_HOST_US))):
        rounds = []
        for _ in range(15):
            t0 = time.perf_counter()
            for _ in range(20):
                for p in probs:
                    fn(p)
            rounds.append((time.perf_counter() - t0) / (20 * len(probs)) * 1e6)
        per_call[name] = {"median": statistics.median(rounds), "max": max(rounds)}
    # A node whose M is dynamic is decided at every rung (inductor.by_m_table), and a SwiGLU
    # up projection's fusion too (tuner/inductor/passes.py): what such a node costs a compile, and the
    # ranges the benchmark's GEMMs get
    def plain_by_m(n, k):
        return by_m_table(lambda m: GemmProblem(m, n, k, b_major="k"), h, QUACK_LAUNCH_HOST_US)

    def swiglu_by_m(n, k):
        return m_ranges(lambda m: decide_swiglu(GemmProblem(m, n, k, b_major="k"), h,
                                                QUACK_LAUNCH_HOST_US, dynamic_m=True))

    shapes = ((INTER, HIDDEN), (HIDDEN, INTER), (HIDDEN, HIDDEN), (KV, HIDDEN))
    for name, fn in (("by_m_table_us", plain_by_m), ("swiglu_by_m_us", swiglu_by_m)):
        rounds = []
        for _ in range(5):
            t0 = time.perf_counter()
            for n, k in shapes:
                fn(n, k)
            rounds.append((time.perf_counter() - t0) / len(shapes) * 1e6)
        per_call[name] = {"median": statistics.median(rounds), "max": max(rounds)}

    def described(table):
        return [[m_max, c and c.short()] for m_max, c in table]

    dynamic_m = {f"{n}x{k}": described(plain_by_m(n, k)) for n, k in shapes}
    dynamic_m[f"swiglu_{INTER}x{HIDDEN}"] = described(swiglu_by_m(INTER, HIDDEN))
    decisions = {}  # what each mode gives the benchmark's GEMMs (without CUDA graphs)
    for p in llama:
        d = {mode: decide(p, mode, h, k, QUACK_LAUNCH_HOST_US)
             for mode, k in (("predicted", 1), ("reduced", REDUCED_TOP_K))}
        decisions[f"{p.m}x{p.n}x{p.k}"] = {
            "predicted": ([c.short() for c in d["predicted"].configs]
                          or dict(d["predicted"].triton_config) or "ATen"),  # quack, Triton
            "reduced_quack_candidates": len(d["reduced"].configs),
            "reduced_triton_templates": d["reduced"].triton,  # host- and memory-bound mm
            # ... whose config the heuristics' retime measured: taken without a benchmark
            "reduced_triton_config": dict(d["reduced"].triton_config) or None,
            "reason": d["predicted"].reason}
    # Triton configs go to the mm of a graph that its launch costs give them, weighed together
    # (CuteTuneChoices.graph_triton): the benchmark's two graphs, per M, as the N x K of the mm
    # that take them (ATen: none do)
    graph_shapes = {"mlp": ((INTER, HIDDEN), (INTER, HIDDEN), (HIDDEN, INTER)),
                    "attn": ((HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN))}
    graphs, weigh_us, regret, templated = {}, [], {}, {}
    costs = h.triton.costs if h.triton is not None else None
    for m in MS:
        for name, shapes in graph_shapes.items():
            gemms = triton_candidates([GemmProblem(m, n, k, b_major="k") for n, k in shapes], h,
                                      QUACK_LAUNCH_HOST_US)
            t0 = time.perf_counter()
            takers = templated[name, m] = h.triton_problems(gemms)
            weigh_us.append((time.perf_counter() - t0) * 1e6)
            graphs[f"{name}_m{m}"] = (sorted({f"{p.n}x{p.k}" for p in takers}) or "ATen"
                                      if gemms else "-")
            if gemms and costs is not None:
                regret[f"{name}_m{m}"] = costs.least_regret([(p, config_key(c))
                                                             for p, c in gemms])
    return {
        "what": "cutetune heuristics: load and per-node lookup cost at compile time (CPU), and "
                "the decisions for the torch.compile benchmark's GEMMs",
        "host": {"machine": platform.machine(), "processor": platform.processor(),
                 "cpus": os.cpu_count(), "python": platform.python_version()},
        "heuristics": {"path": str(path), "source": source, "bytes": path.stat().st_size,
                       "grid_cells": h.grid.size, "exact": len(h.exact),
                       "configs": len(h.configs), "top_k": h.top_k, "digest": h.digest},
        "load_ms": {"first": loads[0], "median": statistics.median(loads), "max": max(loads),
                    "n": len(loads)},
        **per_call,
        "problems": len(probs),
        "targets": {"load_ms": 100, "lookup_us": 100},
        "quack_launch_host_us": QUACK_LAUNCH_HOST_US,
        "decisions": decisions,
        "graph_triton": graphs,  # "-": no mm of the graph has a Triton config
        "graph_triton_weigh_us": {"median": statistics.median(weigh_us), "max": max(weigh_us)},
        # the launch costs' worst-case step over the best choice for the host, across the host
        # speeds they span: above 1.01, no one choice keeps every host within 1 %
        "graph_triton_least_regret": regret,
        # the MLP's up projection fused with silu(gate) * (its product) into one quack GEMM
        # (tuner/swiglu.py), and the config, or None: left to the choices above (a problem
        # graph_triton templates stays unfused, passes.SwigluFusionPass)
        "swiglu_fusion": {f"mlp_m{m}": None if up in templated["mlp", m] else (
            lambda c: c and c.short())(decide_swiglu(up, h, QUACK_LAUNCH_HOST_US))
            for m in MS for up in [GemmProblem(m, INTER, HIDDEN, b_major="k")]},
        # with M dynamic: (largest M of a range, predicted mode's config or None for ATen) per
        # N x K of the benchmark's plain GEMMs, and (.., fused config or None: unfused) for
        # the MLP's up projection
        "dynamic_m": dynamic_m,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="result JSON (default: data/bench/e2e.json, or "
                    "data/bench/heuristics_cpu.json with --cpu-only)")
    ap.add_argument("--cpu-only", action="store_true", help="heuristics timing only, no GPU")
    ap.add_argument("--quick", action="store_true", help=f"M in {QUICK_MS}, 5 repeats")
    ap.add_argument("--ms", type=int, nargs="+", default=list(MS))
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--heuristics", help="heuristics file (default: the packaged one)")
    ap.add_argument("--top-k", type=int, default=None, help="reduced mode's k")
    ap.add_argument("--budget-s", type=float, default=460.0)
    ap.add_argument("--save-code", metavar="DIR",
                    help="write the code Inductor generated for each run into DIR")
    ap.add_argument("--skip-overhead", action="store_true",
                    help="leave out the tiny-GEMM launch overhead (measured by another part)")
    ap.add_argument("--enable-from", choices=ENABLE_FROM, default=ENABLE_FROM[0],
                    help="cutetune's entry: cutetune.enable (forks reduced mode's compile "
                    "helper before Inductor's import) or cutetune.tuner.inductor.choices.enable (after)")
    ap.add_argument("--no-prebuilt-kernels", action="store_true",
                    help="link no prebuilt fused kernels (CUTETUNE_FUSED_KERNELS empty): the "
                         "cold runs build them as a user's unshipped kernels would be")
    ap.add_argument("--warm-for", nargs="*", default=["predicted", "reduced"],
                    choices=("predicted", "reduced"),
                    help="cutetune modes also compiled with the kernel cache warm")
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="combine the runs of several result files (say, M values measured "
                         "in separate calls or on separate GPUs of one host) into --out")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every (M, mode, kernel cache) this many times, round after round; "
                         "the checks take the median over rounds")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.save_code:
        args.save_code = str(Path(args.save_code).resolve())
        Path(args.save_code).mkdir(parents=True, exist_ok=True)
    if args.worker:
        spec = json.loads(args.worker)
        print(json.dumps(overhead_worker(spec) if spec["kind"] == "overhead" else worker(spec)))
        return 0
    default = "heuristics_cpu.json" if args.cpu_only else "e2e.json"
    out = Path(args.out or REPO / "data" / "bench" / default)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.cpu_only:
        res = run_cpu(args)
        out.write_text(json.dumps(res, indent=1))
        print(f"heuristics ({res['heuristics']['source']}; {res['heuristics']['bytes'] / 1024:.0f} "
              f"KiB, {res['heuristics']['configs']} configs): load {res['load_ms']['median']:.1f} "
              f"ms, lookup {res['lookup_us']['median']:.1f} us, decide "
              f"{res['decide_predicted_us']['median']:.1f} / "
              f"{res['decide_reduced_us']['median']:.1f} us (predicted / reduced), a dynamic-M "
              f"node {res['by_m_table_us']['median']:.0f} us (SwiGLU "
              f"{res['swiglu_by_m_us']['median']:.0f} us) -> {out}")
        return 0
    res = merge([json.loads(Path(f).read_text()) for f in args.merge]) if args.merge \
        else run_gpu(args)
    res["targets"] = targets(res)
    res["compile_split_s"] = compile_split(res)
    out.write_text(json.dumps(res, indent=1))
    png = out.with_suffix(".png")
    plot(res, png)
    ov = res.get("launch_overhead") or {}
    if ov.get("status") == "ok":
        print(f"\ntiny GEMM ({ov['size']}^3) host us/call: torch.mm "
              f"{ov['torch.mm']['host_us']:.1f}, "
              f"cutetune {ov['cutetune.quack_mm_out']['host_us']:.1f} "
              f"(+{ov['launcher_minus_torch_host_us']:.1f})")
    print(ratio_table(res))
    print(targets_lines(res["targets"]))
    if res["compile_split_s"]:
        print(split_lines(res["compile_split_s"]))
    print(f"\nwrote {out} and {png} in {res['meta']['total_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
