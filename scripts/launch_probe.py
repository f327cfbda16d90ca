#!/usr/bin/env python
"""Host and GPU time of one GEMM launch by each path a compiled step can take at small M:
ATen's mm (what Inductor's extern call runs), cutetune's quack extern launching a TVM-FFI
library (``launcher.quack_mm_out``) and that library's bare call; then single-GEMM graphs
compiled by Inductor's default (ATen), max-autotune with Triton templates only, and cutetune
predicted with the quack library, so the launch paths are compared where they run for users.

Why: the host-bound rule (``inductor.QUACK_LAUNCH_HOST_US``) was measured when quack kernels
launched through quack's Python path. Since the compile helper builds plain kernels as
libraries, a quack launch may cost the host no more than a Triton template's, with quack's
GPU time, which the dataset puts at or under cuBLAS's at small M on Llama-3-8B's shapes. On
the H200 it did not: compiled, the library's launch cost the host what ATen's extern call
does, 9-12 us more than a template's (data/bench/launch_probe_h200*.json.gz).

  python scripts/launch_probe.py --out launch_probe_h200.json [--ms 1 16 128]
      (committed as data/bench/launch_probe_h200.json.gz, by gzip -9n)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e import _time_calls  # noqa: E402

from cutetune.space.problem import GemmProblem  # noqa: E402
from cutetune.tuner import gemm_library, launcher, measure  # noqa: E402
from cutetune.tuner.heuristics import PackagedHeuristics  # noqa: E402
from cutetune.tuner.prefetch import KernelPrefetcher  # noqa: E402

SHAPES = ((14336, 4096), (4096, 14336), (4096, 4096), (1024, 4096))  # Llama-3-8B's (N, K)
CONFIGS_PER_SHAPE = 3


def problem(m: int, n: int, k: int) -> GemmProblem:
    return GemmProblem(m=m, n=n, k=k, batch=1, dtype="bf16", out_dtype="bf16", a_major="k",
                       b_major="k", arch="sm90")


def library_configs(h, p: GemmProblem, count: int) -> list:
    """The heuristics' first ``count`` configs for ``p`` that can launch from a library."""
    configs, _ = h.lookup(p)
    return [c for c in configs if gemm_library.unsupported_reason(p, c) is None][:count]


def host_us(fn, calls: int = 200, rounds: int = 7) -> float:
    """Median host time to issue one call, in batches short enough that the launch queue never
    fills (the GPU runs behind; the host does not wait for it)."""
    for _ in range(20):
        fn()
    batches = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        batches.append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(batches)


def gpu_us(fn4, p: GemmProblem, l2_bytes: int, policy) -> dict:
    """cutetune's L2-cold timing of ``fn4(a, b, d)`` (tuner.measure), in us."""
    buf = measure.ProblemBuffers(p, l2_bytes)
    out = measure.timed_outcome(fn4, buf, policy)
    return {k.replace("time_ms", "time_us"): v * 1e3 if k.startswith("time_ms") else v
            for k, v in out.items()}


def launch_paths(h, ms, l2_bytes: int, policy) -> list[dict]:
    rows = []
    for m in ms:
        for n, k in SHAPES:
            p = problem(m, n, k)
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
            d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            row = {"m": m, "n": n, "k": k,
                   "aten": {"host_us": host_us(lambda: torch.mm(a, b, out=d)),
                            **gpu_us(lambda a, b, d: torch.mm(a, b, out=d), p, l2_bytes, policy)},
                   "quack": []}
            for c in library_configs(h, p, CONFIGS_PER_SHAPE):
                cfg = launcher.config_tuple(c)
                launcher.quack_mm_out(a, b, d, cfg)
                plan = next(pl for key, pl in launcher._plans.items()
                            if key[0] == cfg and key[1] == a.shape)
                entry = {"config": c.short(), "via": plan.via,
                         "host_us": host_us(lambda: launcher.quack_mm_out(a, b, d, cfg)),
                         **gpu_us(lambda a, b, d: launcher.quack_mm_out(a, b, d, cfg), p,
                                  l2_bytes, policy)}
                if plan.run is not None:
                    entry["bare_library_host_us"] = host_us(lambda: plan.run(a, b, d))
                row["quack"].append(entry)
                print(json.dumps({"m": m, "n": n, "k": k, **entry}), flush=True)
            print(json.dumps({k: v for k, v in row.items() if k != "quack"}), flush=True)
            rows.append(row)
    return rows


def host_profile(fn, x, calls: int = 300) -> str:
    """Where the host time of ``calls`` calls of a compiled step goes (cProfile, by own time)."""
    for _ in range(20):
        fn(x)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn(x)
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    return text.getvalue()


def compiled_graphs(ms) -> list[dict]:
    """One GEMM ``x @ w.t()`` (N = K = 4096, where the heuristics prefer quack at M 1 and
    128) compiled per mode; each mode's step timed as bench_e2e times it."""
    from cutetune.tuner import inductor

    inductor.QUACK_LAUNCH_HOST_US = 0.0  # nothing host-bound: the quack library for every M
    torch._logging.set_logs(output_code=True)  # each mode's generated code, in the log
    rows = []
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for m in ms:
        x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        fns = {}
        for mode in ("default", "max-autotune-triton", "predicted-quack"):
            torch._dynamo.reset()
            namespace = {"w": w}
            exec("def step(x):\n    return x @ w.t()\n", namespace)  # noqa: S102
            options = ({"max_autotune": True, "max_autotune_gemm_backends": "TRITON"}
                       if mode == "max-autotune-triton" else None)
            if mode == "predicted-quack":
                with inductor.enable("predicted", fuse_swiglu=False):
                    fn = torch.compile(namespace["step"])
                    fn(x)
            else:
                fn = torch.compile(namespace["step"], options=options)
                fn(x)
            fns[mode] = fn
        ref = x.float() @ w.float().t()
        for mode, fn in fns.items():
            rows.append({"m": m, "mode": mode, "profile": host_profile(fn, x)})
        for rnd in range(3):
            for mode, fn in fns.items():
                t = _time_calls(torch, fn, x, repeats=15)
                err = float((fn(x).float() - ref).norm() / ref.norm())
                rows.append({"m": m, "mode": mode, "round": rnd, "rel_err": err,
                             **{k: t[k] for k in ("median", "p20", "p80", "host")}})
                print(json.dumps(rows[-1]), flush=True)
    torch._logging.set_logs(output_code=False)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 16, 128])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    h = PackagedHeuristics()
    kernels = {(problem(m, n, k), c) for m in args.ms for n, k in SHAPES
               for c in library_configs(h, problem(m, n, k), CONFIGS_PER_SHAPE)}
    kernels |= {(problem(m, 4096, 4096), c) for m in args.ms
                for c in h.lookup(problem(m, 4096, 4096))[0][:1]}
    helper = KernelPrefetcher("sm90")
    t0 = time.perf_counter()
    helper.submit(sorted(kernels, key=lambda pc: (pc[0].key(), pc[1].short())))
    stats = helper.wait(timeout=300)
    build = {"kernels": len(kernels), **stats, "failures": helper.failures(),
             "wall_s": time.perf_counter() - t0}
    helper.close()
    print(json.dumps(build), flush=True)
    env = measure.environment()
    policy = measure.TimingPolicy()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "build": build, "launch_host_us_probe": measure.launch_host_us(),
              "paths": launch_paths(h, args.ms, env["l2_bytes"], policy),
              "compiled": compiled_graphs([m for m in args.ms if m in (1, 128)])}
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
