#!/usr/bin/env python
"""GPU times of SwiGLU's up projection fused with its gate (``silu(G) * (x @ W)``, one quack
GEMM: tuner/swiglu.py) against what Inductor's default runs for it (cuBLAS's mm, then
Inductor's fused pointwise kernel for silu(G) * U), and of the plain GEMMs (cuBLAS and quack
with the same configs), on the MLP's up-projection shapes.

Timed by cutetune's method (tuner/measure.py): numerics against an fp32 reference first, then
L2-cold over rotating operand sets, median and spread of CUDA-event-timed launches. Configs:
the shipped heuristics' top-k for each shape (the fusion's candidates: ``decisions.fusion_config``
takes the first valid one without split-K) plus any given with --configs (KernelConfig JSON).

  python scripts/swiglu_bench.py --ms 1024 4096 8192 [--shapes N:K ...] --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from cutetune.tuner.inductor import decisions
from cutetune.space.config import KernelConfig
from cutetune.space.problem import GemmProblem
from cutetune.tuner.measure import timing as measure
from cutetune.tuner.kernels import swiglu
from cutetune.models.heuristics import PackagedHeuristics
from cutetune.tuner.kernels.problems import device_arch


def bench_shape(problem: GemmProblem, configs, l2_bytes: int, policy) -> list[dict]:
    """One row per variant: the unfused default (cuBLAS + pointwise), fused quack per config;
    then the plain GEMMs (cuBLAS, quack per config) from tuner.measure."""
    pointwise = torch.compile(lambda g, u: torch.nn.functional.silu(g) * u)
    buf = measure.ProblemBuffers(problem, l2_bytes, gated=True)
    rows = [{"variant": "cublas+pointwise", **measure.timed_outcome(
        lambda a, b, d, g: pointwise(g, torch.mm(a, b, out=d)), buf, policy)}]
    a, b, d, g = buf.sets[0]
    for config in configs:
        reason = swiglu.unsupported_reason(a, b, g, d, config)
        if reason:
            rows.append({"variant": "fused", "config": config.to_dict(), "status": "unsupported",
                         "error": reason})
            continue
        t0 = time.perf_counter()
        row = measure.timed_outcome(
            lambda a, b, d, g, c=config: swiglu.quack_mm_silu_mul_out(a, b, g, d, c), buf, policy)
        row["via"] = swiglu.launched_via(a, b, g, d, config)
        row["ran_quack"] = row["via"] is not None
        rows.append({"variant": "fused", "config": config.to_dict(), "config_key": config.short(),
                     "first_call_s": time.perf_counter() - t0, **row})
    del buf, a, b, d, g  # free the gated sets before the plain GEMMs allocate theirs
    torch.cuda.empty_cache()
    task = measure.MeasureTask(problem=problem, configs=tuple(configs), cublas=True,
                               policy=policy, suite="swiglu_bench")
    for r in measure.measure(task):
        rows.append({"variant": "plain_" + r["backend"], "config": {} if r["backend"] == "cublas"
                     else {k: r[k] for k in KernelConfig.__dataclass_fields__},
                     "config_key": r["config_key"],
                     **{k: r.get(k) for k in ("status", "error", "rel_err", "time_ms",
                                              "time_ms_p20", "time_ms_p80", "n_reps")}})
    return rows


def summary(rows: list[dict]) -> dict:
    """Per shape: the heuristics' fusion pick and the best fused config over the unfused
    default, and the best plain quack over plain cuBLAS."""
    def t(variant, key=None):
        ok = [r for r in rows if r["variant"] == variant and r.get("status") == "ok"
              and (key is None or r.get("config_key") == key)]
        return min((r["time_ms"] for r in ok), default=None)

    unfused = t("cublas+pointwise")
    pick = next((r for r in rows if r["variant"] == "fused" and r.get("pick")), None)
    fused_best, fused_pick = t("fused"), pick and pick.get("time_ms")
    plain_q, plain_c = t("plain_quack"), t("plain_cublas")
    ratio = lambda a, b: (a / b) if a and b else None  # noqa: E731
    return {"unfused_ms": unfused, "fused_pick_ms": fused_pick, "fused_best_ms": fused_best,
            "fused_pick_over_unfused": ratio(fused_pick, unfused),
            "fused_best_over_unfused": ratio(fused_best, unfused),
            "plain_cublas_ms": plain_c, "plain_quack_best_ms": plain_q,
            "plain_quack_best_over_cublas": ratio(plain_q, plain_c),
            "pick": pick and pick.get("config_key")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ms", type=int, nargs="+", default=[1024, 4096, 8192])
    ap.add_argument("--shapes", nargs="+", default=["14336:4096"], metavar="N:K",
                    help="up projections' out:in features (default Llama-3-8B's)")
    ap.add_argument("--configs", nargs="*", default=[], metavar="JSON",
                    help="extra KernelConfig dicts, as JSON")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    measure.init_gpu_worker(None)
    arch = device_arch(torch.device("cuda"))
    env = measure.environment()
    heuristics = PackagedHeuristics()
    policy = measure.TimingPolicy()
    extra = [KernelConfig.from_dict(json.loads(c)) for c in args.configs]
    shapes = []
    for (n, k), m in ((tuple(map(int, s.split(":"))), m) for s in args.shapes for m in args.ms):
        problem = GemmProblem(m=m, n=n, k=k, dtype="bf16", out_dtype="bf16",
                              a_major="k", b_major="k", arch=arch)
        pick = decisions.fusion_config(problem, heuristics)
        top = [c for c in heuristics.lookup(problem)[0] if c.split_k == 1]
        configs = list(dict.fromkeys([*([pick] if pick else []), *top, *extra]))
        rows = bench_shape(problem, configs, env["l2_bytes"], policy)
        for r in rows:
            r["pick"] = bool(pick) and r["variant"] == "fused" and r.get("config") == pick.to_dict()
        shapes.append({"problem": problem.to_dict(),
                       "pointwise_share": decisions.pointwise_share(problem),
                       "rows": rows, "summary": summary(rows)})
        print(m, n, k, json.dumps(shapes[-1]["summary"]), flush=True)
    meta = {k: v for k, v in env.items() if k != "host"}
    meta["heuristics_digest"] = heuristics.digest
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "command": "python scripts/swiglu_bench.py "
                   + " ".join(sys.argv[1:]), "shapes": shapes}, f, indent=1)


if __name__ == "__main__":
    main()
