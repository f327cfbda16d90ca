#!/usr/bin/env python
"""Wall time to have a reduced-mode compile's prefetched kernels ready to launch: cutetune's
forked compile helper (``tuner/kernels/helper.py``) against quack's own compile pool
(``quack.cache.async_compile``), each run in a fresh process with empty kernel caches.

The kernels are what reduced mode sends to the compile workers for Llama-3-8B's decoder MLP
at one M: the heuristics' top-k configs of its two GEMM shapes (gate/up, down). The clock
starts once the process has imported torch (where ``cutetune.enable`` starts the helper) and
stops when every kernel is ready:

- ``helper``: the prefetcher as reduced mode runs it; a plain kernel becomes a TVM-FFI library
  (``library.build_library``) where a C compiler links, else an object file in quack's cache.
- ``helper_objects``: the same helper with linking off, so every kernel becomes quack's object
  file: the artefact quack's pool makes, by our process machinery.
- ``quack_pool``: quack's ``CompilePool`` on its shared executor (a forkserver sidecar that
  imports torch and quack, workers forked from it), each kernel submitted as the key of
  ``quack.gemm._compile_gemm`` (``compile.kernel_signature``); ready is the pool's "done". The
  submitting process imports quack first (the key holds cutlass's types): counted.

All variants compile GPU-blind for sm90 with the same number of workers, so this runs on a
CPU host (where no GPU is seen, ``QUACK_ARCH``/``CUTE_DSL_ARCH`` are set as quack's CPU-only
workflow does) and on the GPU host alike.

  python scripts/compile_time_ab.py --out data/bench/compile_time_ab_cpu.json \
      [--m 1024] [--top-k 5] [--workers N] [--repeats 2] [--variants helper quack_pool ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import HIDDEN, INTER, cpu_during, cpu_sample

VARIANTS = ("helper", "helper_objects", "quack_pool")
ARCH = "sm90"


def mlp_kernels(m: int, top_k: int) -> list:
    """(problem, config) of the top-k configs of the MLP's GEMM shapes, one per distinct kernel
    as the prefetcher files them (``helper.kernel_key``)."""
    from cutetune.models.heuristics import PackagedHeuristics
    from cutetune.space.problem import GemmProblem
    from cutetune.space.rules import is_valid
    from cutetune.tuner.kernels.helper import kernel_key

    h, out = PackagedHeuristics(), {}
    for n, k in ((INTER, HIDDEN), (HIDDEN, INTER)):
        problem = GemmProblem(m, n, k, arch=ARCH)
        configs = [c for c in h.lookup(problem)[0] if is_valid(c, ARCH, problem)][:top_k]
        for c in configs:
            out.setdefault(kernel_key(problem, c), (problem, c))
    return list(out.values())


def run_helper(kernels, workers: int, link: bool) -> dict:
    from cutetune.tuner.kernels import aot
    from cutetune.tuner.kernels.helper import KernelPrefetcher

    if not link:
        aot.can_link = lambda: False
    helper = KernelPrefetcher(ARCH, workers=workers)
    helper.submit(kernels)
    submitted = time.monotonic()
    stats = helper.wait(timeout=600)
    ready = time.monotonic()
    failures = helper.failures()
    timeline = helper.timeline
    helper.close()
    return {"submitted_at": submitted, "ready_at": ready, "stats": stats,
            "failures": failures, "timeline": timeline,
            "libraries": sum(aot.library_ready(k[1]) for k in helper.state if k[0] == "library")}


def run_quack_pool(kernels, workers: int) -> dict:
    os.environ["QUACK_COMPILE_WORKERS"] = str(workers)
    from quack.cache.async_compile import CompilePool, get_shared_executor
    from quack.gemm import _compile_gemm

    from cutetune.tuner.kernels.compile import kernel_object_path, kernel_signature

    imported = time.monotonic()
    pool = CompilePool(executor=get_shared_executor())
    shas = []
    for problem, config in kernels:
        path = kernel_object_path(problem, config)
        shas.append(path.stem)
        if not pool.submit(path.stem, _compile_gemm, kernel_signature(problem, config), {},
                           path):
            raise RuntimeError(f"quack's pool refused {config.short()}")
    submitted = time.monotonic()
    states, done_at = {}, {}
    while len(states) < len(shas):
        for sha in shas:
            if sha not in states:
                state, err = pool.poll(sha)
                if state in ("done", "failed"):
                    states[sha] = err or state
                    done_at[sha] = time.monotonic()
        time.sleep(0.02)
    ready = time.monotonic()
    pool.shutdown()
    failures = {s: e for s, e in states.items() if e != "done"}
    return {"imported_at": imported, "submitted_at": submitted, "ready_at": ready,
            "stats": {"submitted": len(shas), "done": len(shas) - len(failures),
                      "failed": len(failures)},
            "failures": failures, "done_times": sorted(done_at.values())}


def one_run(variant: str, m: int, top_k: int, workers: int) -> dict:
    """In a fresh process whose caches the caller emptied: the variant's times, from torch's
    import on."""
    import torch

    t0 = time.monotonic()
    if not torch.cuda.is_available():  # quack's CPU-only compile workflow
        os.environ.setdefault("QUACK_ARCH", "sm_90")
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    kernels = mlp_kernels(m, top_k)
    chosen = time.monotonic()
    if variant == "quack_pool":
        out = run_quack_pool(kernels, workers)
    else:
        out = run_helper(kernels, workers, link=variant == "helper")
    rel = {k: round(v - t0, 3) for k, v in out.items() if k.endswith("_at")}
    if "done_times" in out:  # when each kernel was seen ready
        rel["done_times"] = [round(t - t0, 3) for t in out["done_times"]]
    return {**out, **rel, "variant": variant, "kernels": len(kernels),
            "configs": [c.short() for _, c in kernels], "chosen_at": round(chosen - t0, 3)}


def fresh_run(variant: str, args) -> dict:
    """``one_run`` in a new interpreter with new, empty quack and cutetune caches, with the
    CPU seconds of that process and of the children it reaped before exiting (not the helper's
    or the pool's workers: the submitting process's own cost), and the machine's busy cores
    meanwhile (other processes' load shows there)."""
    with tempfile.TemporaryDirectory(prefix="cutetune-ab-") as tmp:
        env = {**os.environ, "QUACK_CACHE_DIR": f"{tmp}/quack", "CUTETUNE_CACHE": f"{tmp}/ct",
               "CUTETUNE_FUSED_KERNELS": ""}
        cmd = [sys.executable, __file__, "--one", variant, "--m", str(args.m),
               "--top-k", str(args.top_k), "--workers", str(args.workers)]
        t0, cpu0 = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
        machine0 = cpu_sample()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        wall, cpu1 = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
        machine = cpu_during(machine0, cpu_sample())
    if proc.returncode:
        raise RuntimeError(f"{variant} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "process_wall_s": round(wall, 3),
            "reaped_cpu_s": round(cpu, 2),
            "machine_busy_cores": machine and machine["machine_busy_cores"]}


def summarize(runs: list[dict], variants: list[str]) -> dict:
    """Median times by variant, and quack's pool over each helper variant (ready times)."""
    med = {v: {key: statistics.median(r[key] for r in runs if r["variant"] == v)
               for key in ("ready_at", "submitted_at", "process_wall_s")} for v in variants}
    ratios = {f"quack_pool/{v}": round(med["quack_pool"]["ready_at"] / med[v]["ready_at"], 3)
              for v in variants if v != "quack_pool" and "quack_pool" in med}
    return {"median_s": med, "ready_ratios": ratios,
            "all_ready": all(r["stats"]["failed"] == 0 for r in runs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, default=1024)
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--workers", type=int, default=max(1, min(16, (os.cpu_count() or 2) - 1)))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_run(args.one, args.m, args.top_k, args.workers)))
        return
    runs = []
    for repeat in range(args.repeats):
        # each repeat starts one variant later, so that none always runs first
        order = args.variants[repeat % len(args.variants):] + \
            args.variants[:repeat % len(args.variants)]
        for variant in order:
            run = {**fresh_run(variant, args), "repeat": repeat}
            print(f"{variant:15s} repeat {repeat}: {run['kernels']} kernels ready at "
                  f"{run['ready_at']:.1f} s (submitted at {run['submitted_at']:.1f} s), "
                  f"machine busy {run['machine_busy_cores']} cores, {run['stats']}", flush=True)
            runs.append(run)
    result = {"meta": {"command": " ".join(["scripts/compile_time_ab.py", *sys.argv[1:]]),
                       "python": platform.python_version(), "cpus": os.cpu_count(),
                       "machine": platform.node(), "started": time.time(),
                       "m": args.m, "top_k": args.top_k, "workers": args.workers},
              "summary": summarize(runs, args.variants), "runs": runs}
    print(json.dumps(result["summary"], indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
