"""Time problem_feature_matrix over every valid config of a few problems, on this CPU.

The tuner featurizes the whole space of a problem before the model ranks it, once per problem,
so this must stay far below a kernel compile: the target is 5 ms for all sm90 configs.

    python scripts/bench_features.py [--runs 50] [--out data/bench/features_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchlib import SHAPES, cpu_name

from cutetune.space import GemmProblem, enumerate_configs
from cutetune.space.device import device_for
from cutetune.space.features import FEATURE_NAMES, problem_feature_matrix

TARGET_MS = 5.0


def time_ms(fn, runs: int, warmup: int = 5) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=50, help="timed runs per case (default 50)")
    ap.add_argument("--out", default="data/bench/features_cpu.json", help="JSON result path")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")

    cases = []
    print(f"{'arch':6} {'problem':45} {'rows':>5} {'median ms':>10} {'p90 ms':>8}  "
          f"target {TARGET_MS} ms")
    for arch in ("sm90", "sm100"):
        device = device_for(arch)
        for shape in SHAPES:
            problem = GemmProblem(**shape, arch=arch)
            configs = enumerate_configs(arch, problem)
            x = problem_feature_matrix(problem, configs, device)
            assert x.shape == (len(configs), len(FEATURE_NAMES)) and np.isfinite(x).all()
            ms = time_ms(lambda: problem_feature_matrix(problem, configs, device), args.runs)
            med, p90 = statistics.median(ms), float(np.percentile(ms, 90))
            ok = med < TARGET_MS
            print(f"{arch:6} {problem.key():45} {len(configs):5d} {med:10.3f} {p90:8.3f}  "
                  f"{'ok' if ok else 'OVER'}")
            cases.append(dict(arch=arch, device=device.name, problem=problem.key(),
                              rows=len(configs), median_ms=med, p90_ms=p90,
                              min_ms=min(ms), under_target=ok))

    result = dict(
        what="problem_feature_matrix over all valid configs of each problem (CPU wall time)",
        target_ms=TARGET_MS, runs=args.runs, features=len(FEATURE_NAMES),
        cpu=cpu_name(), cpu_count=os.cpu_count(), python=sys.version.split()[0],
        numpy=np.__version__, timestamp=time.strftime("%Y-%m-%dT%H:%M:%S%z"), cases=cases,
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0 if all(c["under_target"] for c in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
