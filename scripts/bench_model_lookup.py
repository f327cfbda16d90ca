"""What asking the packaged cost model at compile time costs predicted mode on this CPU
(``models.heuristics.PackagedHeuristics``): once per process, the first lookup of a shape the
file has no exact entry for (xgboost's import, the model's load, the config table), against the
file's grid alone, and the same where scikit-learn is not installed (its import blocked:
xgboost imports it where it is); then per GEMM node, a lookup (the top-8 ranking and the
fallback's verdict) of a shape not asked before; and per dynamic-M node, its by-M table (one
lookup per rung).

    python scripts/bench_model_lookup.py [--runs 20] [--out data/bench/model_lookup_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchlib import SHAPES, cpu_name

from cutetune.models import load_model
from cutetune.models.heuristics import ModelHeuristics
from cutetune.space import GemmProblem
from cutetune.tuner.inductor.decisions import by_m_table

FIRST = """
import time, sys
{block}
from cutetune.models.heuristics import PackagedHeuristics
from cutetune.space import GemmProblem
t = time.perf_counter()
PackagedHeuristics(models={models}).lookup(GemmProblem(3000, 5000, 6000))
print(time.perf_counter() - t)
"""


def first_lookup_s(models: bool, runs: int, sklearn: bool = True) -> float:
    """Median over fresh processes of the first lookup, the file's load included."""
    code = FIRST.format(models=models, block="" if sklearn else "sys.modules['sklearn'] = None")
    times = [float(subprocess.run([sys.executable, "-c", code], check=True,
                                  capture_output=True, text=True).stdout) for _ in range(runs)]
    return statistics.median(times)


def median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out", default="data/bench/model_lookup_cpu.json")
    args = ap.parse_args(argv)

    model = load_model()  # each run asks a fresh ModelHeuristics: nothing asked before
    ModelHeuristics(model).lookup(GemmProblem(3000, 5000, 6000))  # builds the config table
    cases = []
    for shape in SHAPES:
        p = GemmProblem(**shape)
        cases.append({"problem": p.key(), "lookup_ms": median_ms(
            lambda: ModelHeuristics(model).lookup(p), args.runs)})
    rungs = median_ms(lambda: by_m_table(lambda m: GemmProblem(m, 14336, 4096),
                                         ModelHeuristics(model), 0.0), max(args.runs // 4, 3))
    result = {
        "what": "predicted mode's compile-time cost of asking the packaged cost model",
        "first_lookup_s": {"model": first_lookup_s(True, 5), "file_grid": first_lookup_s(False, 5),
                           "model_without_sklearn": first_lookup_s(True, 5, sklearn=False)},
        "lookup_ms": cases, "worst_lookup_ms": max(c["lookup_ms"] for c in cases),
        "by_m_table_ms": {"problem": "M x 14336 x 4096, 16 rungs", "median_ms": rungs},
        "cpu": cpu_name(), "cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0],
        "python": sys.version.split()[0], "runs": args.runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
