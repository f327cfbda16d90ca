#!/usr/bin/env python
"""Step-time ratios between modes with the same kernel counts, from scripts/step_ab.py files
that kept each round's steps (``rounds_step_us``): the ratio of the modes' medians (what
``--report`` checks) and the median and p20-p80 of the ratios paired round by round (a drift
common to both modes cancels there). Predicted and reduced mode compile the same output code
at M <= 128 (data/reports/gpu/h200_1gpu_s7/code_hostcal3.tgz), so there a ratio away from 1
is the noise the 1 % step target has to be judged against.

  python scripts/step_noise.py ab_*.json [--pairs reduced/predicted predicted/max-autotune]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def pair_ratios(workload: dict, a: str, b: str) -> dict | None:
    """a over b in one workload of one step_ab file, or None where either did not run or their
    kernel counts differ (different code: not noise)."""
    rounds, kernels = workload.get("rounds_step_us", {}), workload.get("kernels", {})
    if a not in rounds or b not in rounds or kernels.get(a) != kernels.get(b):
        return None
    paired = np.asarray(rounds[a]) / np.asarray(rounds[b])
    p20, p50, p80 = np.quantile(paired, (0.2, 0.5, 0.8))
    return {"of_medians": workload["step_us"][a] / workload["step_us"][b],
            "paired_median": float(p50), "paired_p20": float(p20), "paired_p80": float(p80)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--pairs", nargs="+", default=["reduced/predicted"], metavar="A/B")
    args = ap.parse_args()
    worst = 1.0
    for f in args.files:
        part = json.loads(f.read_text())
        for name, w in part["workloads"].items():
            for pair in args.pairs:
                r = pair_ratios(w, *pair.split("/"))
                if r is None:
                    continue
                worst = max(worst, r["of_medians"], 1 / r["of_medians"])
                print(f"{f.name:26s} M={part['m']:<4d} gc_off={part.get('gc_off', False)!s:5s} "
                      f"{name:4s} {pair:22s} medians {r['of_medians']:.3f}  paired "
                      f"{r['paired_median']:.3f} [{r['paired_p20']:.3f}, {r['paired_p80']:.3f}]")
    print(f"largest deviation of the medians from 1: {worst:.3f}x")


if __name__ == "__main__":
    main()
