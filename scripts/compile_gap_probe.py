"""One-off CPU probe (issue #34's compile target: predicted <= default + 2 s, cold): how much
of a cold compile of the Qwen3-30B-A3B MoE block (``bench_moe.moe_block``, a dynamic token
count, forward and training) predicted mode adds to Inductor's default, on this machine's CPU.

The block is compiled for the CPU with quack's arch reported as sm90, so cutetune's passes and
picks run as on the H200 host; quack's launch is replaced by torch._grouped_mm (no GPU here),
so the two modes run the same math. compile_s = the first call (compile and run) less a warm
call; ``inductor_s``: the time in Inductor's compile (AOTAutograd's, the forward's and the
backward's), which leaves out the CPU run's noise. ``pass_s``: the time in cutetune's grouped
pass (picks and tables), part of it. ``helper`` runs
predicted mode with the compile helper on (it forks and compiles quack's kernels on this
machine's cores beside Inductor), ``helper_nice`` the same with the helper at the lowest CPU
priority (nice 19); the others with it off (QUACK_CACHE_ENABLED=0).

    python scripts/compile_gap_probe.py --out data/reports/compile_gap_cpu.json --repeats 3

``--first-pick TREE ...`` instead times a compile's first grouped picks (the table of Qwen3's
down-projection weight gradient for a dynamic token count, from the picks the shipped model
file keeps) in a fresh process of each source tree in turn, the page cache dropped before each
(``cold``) or not (``warm``): what reading the kept picks imports.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

MODES = ("default", "predicted", "helper", "helper_nice")


def child(mode: str, phase: str) -> dict:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
    from bench_moe import moe_block

    import cutetune
    from cutetune.space.suites import MOE_MODELS
    from cutetune.tuner.inductor import passes
    from cutetune.tuner.kernels import grouped_mm, problems, quack_gemm

    problems.device_arch = lambda device: "sm90"
    if mode == "helper_nice":  # the helper and its workers at the lowest CPU priority
        from cutetune.tuner.kernels import helper

        run_forked = helper._run_forked
        helper._run_forked = lambda *args: (os.nice(19), run_forked(*args))

    def launch(plan, a, b, out, c, alpha, beta, cu_seqlens_m=None, cu_seqlens_k=None,
               a_idx=None):
        cu = cu_seqlens_m if cu_seqlens_m is not None else cu_seqlens_k
        out.copy_(torch._grouped_mm(a, b, offs=cu[1:]) if cu is not None else a @ b)

    quack_gemm.launch = grouped_mm.launch = launch
    pass_s = [0.0]
    apply = passes.GroupedMmPass.apply

    def timed_apply(self, graph):
        t0 = time.perf_counter()
        apply(self, graph)
        pass_s[0] += time.perf_counter() - t0

    passes.GroupedMmPass.apply = timed_apply
    import torch._inductor.compile_fx as cfx

    inductor_s, depth = [0.0], [0]

    def timed(fn):  # Inductor's own time, forward and backward, outermost calls only
        def run(*args, **kwargs):
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
                if not depth[0]:
                    inductor_s[0] += time.perf_counter() - t0
        return run

    cfx.compile_fx, cfx.compile_fx_inner = timed(cfx.compile_fx), timed(cfx.compile_fx_inner)
    layer = MOE_MODELS["qwen3_30b_a3b"]
    torch.manual_seed(0)
    module = moe_block(torch, layer, lambda a, b, offs: torch._grouped_mm(a, b, offs=offs),
                       device="cpu")
    if mode != "default":
        cutetune.enable("predicted")
    forward = torch.compile(module)
    x = torch.randn(128, layer.hidden, dtype=torch.bfloat16)
    torch._dynamo.maybe_mark_dynamic(x, 0)
    gy = torch.randn_like(x)

    def step():
        if phase == "fwd":
            with torch.no_grad():
                return forward(x)
        forward(x).backward(gy)

    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    step()
    warm = time.perf_counter() - t0
    return {"mode": mode, "phase": phase, "first_call_s": first, "warm_call_s": warm,
            "compile_s": first - warm, "inductor_s": inductor_s[0], "pass_s": pass_s[0]}


FIRST_PICK = """
import json, sys, time
import torch
t0 = time.perf_counter()
from cutetune.tuner.kernels import grouped_mm as gmm
from cutetune.space.suites import MOE_MODELS, expert_gemm, expert_projections
layer = MOE_MODELS["qwen3_30b_a3b"]
p = expert_gemm("wgrad", layer.experts, 8192, *expert_projections(layer)["down"])
table = gmm.picker().table(lambda s: gmm.with_ragged(p, s), True)
print(json.dumps({"first_pick_s": time.perf_counter() - t0, "ranges": len(table),
                  "pyarrow": "pyarrow" in sys.modules, "xgboost": "xgboost" in sys.modules}))
"""


def first_pick(trees: list[str], repeats: int) -> dict:
    runs = []
    for r in range(repeats):
        for cache in ("cold", "warm"):
            for tree in trees:  # interleaved
                if cache == "cold":
                    subprocess.run(["sync"], check=True)
                    with open("/proc/sys/vm/drop_caches", "w") as f:
                        f.write("3\n")
                out = subprocess.run([sys.executable, "-c", FIRST_PICK], cwd=tree,
                                     capture_output=True, text=True, check=True).stdout
                row = {"repeat": r, "tree": tree, "cache": cache,
                       **json.loads(out.strip().splitlines()[-1])}
                print(json.dumps(row), flush=True)
                runs.append(row)
    summary = {f"{tree} {cache}": statistics.median(
        x["first_pick_s"] for x in runs if x["tree"] == tree and x["cache"] == cache)
        for tree in trees for cache in ("cold", "warm")}
    return {"runs": runs, "median_first_pick_s": summary}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--first-pick", nargs="+", metavar="TREE")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "PHASE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    if args.first_pick:
        result = {"command": " ".join(["scripts/compile_gap_probe.py", *sys.argv[1:]]),
                  "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                  **first_pick(args.first_pick, args.repeats)}
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(json.dumps(result["median_first_pick_s"], indent=1))
        return
    runs = []
    for r in range(args.repeats):
        for phase in ("fwd", "train"):
            for mode in MODES:  # interleaved: drift on this machine hits each mode alike
                with tempfile.TemporaryDirectory() as tmp:
                    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor",
                           "TRITON_CACHE_DIR": f"{tmp}/triton", "QUACK_CACHE_DIR": f"{tmp}/quack",
                           "CUTETUNE_CACHE": f"{tmp}/cutetune",
                           "QUACK_CACHE_ENABLED": "1" if mode.startswith("helper") else "0"}
                    out = subprocess.run([sys.executable, __file__, "--out", "-", "--child",
                                          mode, phase], env=env, capture_output=True,
                                         text=True, check=True).stdout
                row = {"repeat": r, **json.loads(out.strip().splitlines()[-1])}
                print(json.dumps(row), flush=True)
                runs.append(row)
    summary = {}
    for phase in ("fwd", "train"):
        med = {m: statistics.median(x["compile_s"] for x in runs
                                    if x["mode"] == m and x["phase"] == phase) for m in MODES}
        ind = {m: statistics.median(x["inductor_s"] for x in runs
                                    if x["mode"] == m and x["phase"] == phase) for m in MODES}
        summary[phase] = {"median_compile_s": med, "median_inductor_s": ind,
                          "inductor_predicted_minus_default_s": ind["predicted"] - ind["default"],
                          "predicted_minus_default_s": med["predicted"] - med["default"],
                          "helper_minus_default_s": med["helper"] - med["default"],
                          "helper_nice_minus_default_s": med["helper_nice"] - med["default"],
                          "median_pass_s": statistics.median(
                              x["pass_s"] for x in runs
                              if x["mode"] == "predicted" and x["phase"] == phase)}
    result = {"command": " ".join(["scripts/compile_gap_probe.py", *sys.argv[1:]]),
              "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
              "block": "qwen3_30b_a3b, 128 tokens, dynamic token count, bf16, on the CPU",
              "runs": runs, "summary": summary}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
