"""Time CostModel.rank over every valid config of a few problems, features included, on this CPU.

The tuner ranks a problem's whole space before it compiles anything, and predicted mode does
it on a cache miss, so this must stay negligible next to a kernel compile: the target is 10 ms
to order all valid sm90 configs of a problem (>= 1000 of them) and return the first TOP_K with
predicted times, what the tuner asks for. When the shipped ranker is a ranking objective, the
times come from a second booster run on the returned configs only, so also asking times for
the whole space (top_k=None, recorded as full_*) costs up to twice as much.

    python scripts/bench_rank.py [--model PATH] [--runs 50] [--out data/bench/rank_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from benchlib import SHAPES, cpu_name

from cutetune.models import load_model
from cutetune.space import GemmProblem

TARGET_MS = 10.0
TOP_K = 32


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="model file (default: the shipped sm90 bf16 model)")
    ap.add_argument("--runs", type=int, default=50, help="timed runs per problem (default 50)")
    ap.add_argument("--out", default="data/bench/rank_cpu.json", help="JSON result path")
    args = ap.parse_args(argv)

    model = load_model(args.model)
    cases = []
    for shape in SHAPES:
        p = GemmProblem(**shape)
        configs = len(model.rank(p))  # warm-up: builds the arch's config table once
        case = {"problem": p.key(), "configs": configs}
        for prefix, top_k in (("", TOP_K), ("full_", None)):
            for _ in range(4):
                model.rank(p, top_k=top_k)
            wall, cpu = [], []
            for _ in range(args.runs):
                t, c = time.perf_counter(), time.process_time()
                model.rank(p, top_k=top_k)
                wall.append((time.perf_counter() - t) * 1e3)
                cpu.append((time.process_time() - c) * 1e3)
            wall.sort()
            case.update({f"{prefix}median_ms": statistics.median(wall),
                         f"{prefix}p90_ms": wall[int(0.9 * (len(wall) - 1))],
                         f"{prefix}min_ms": wall[0],
                         f"{prefix}cpu_median_ms": statistics.median(cpu)})
        cases.append(case)
        print(f"{p.key():<44} {configs:>5} configs  top-{TOP_K}: median {case['median_ms']:.2f} ms"
              f" (CPU {case['cpu_median_ms']:.2f})  all with times: median "
              f"{case['full_median_ms']:.2f} ms (CPU {case['full_cpu_median_ms']:.2f})")
    worst = max(c["median_ms"] for c in cases)
    worst_cpu = max(c["cpu_median_ms"] for c in cases)
    result = {
        "what": f"CostModel.rank(problem, top_k={TOP_K}) over all valid configs, features "
                "included (full_*: top_k=None)",
        "target_ms": TARGET_MS, "top_k": TOP_K, "worst_median_ms": worst,
        "worst_cpu_median_ms": worst_cpu, "meets_target": worst < TARGET_MS,
        "meets_target_cpu_time": worst_cpu < TARGET_MS,
        "cpu": cpu_name(), "cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0],
        "python": sys.version.split()[0], "model": args.model or "shipped",
        "ranker": {k: getattr(model.ranker, k) for k in ("objective", "n_estimators", "max_depth")},
        "separate_timer": model.timer is not model.ranker, "runs": args.runs, "cases": cases}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"worst median {worst:.2f} ms wall, {worst_cpu:.2f} ms CPU (target {TARGET_MS} ms; "
          f"1-min load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs) -> {args.out}")
    return 0 if worst < TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
