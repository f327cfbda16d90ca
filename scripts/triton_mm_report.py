#!/usr/bin/env python
"""How well one Triton mm config per M bucket serves shapes it was not fitted on.

From a Triton sweep (scripts/triton_mm_sweep.py), the shapes predicted mode asks about
(host-bound and memory-bound: tuner.heuristics.predicted_triton_shapes), each model family
held out in turn: its shapes get the bucket picks fitted on the other families
(models.triton_mm.holdout), timed by the sweep's own measurements. Ratios are GPU time as
Inductor's benchmark measured it, without the host time a Triton launch saves over ATen.

  python scripts/triton_mm_report.py --sweep data/triton_mm/h200_bf16.jsonl \\
      --out data/reports/triton_mm_h200_bf16.json \\
      [--heldout-family llama3_8b --heldout-heuristics /tmp/heldout.json]

With --heldout-heuristics, also writes the packaged heuristics with a Triton table fitted
without that family (for step benchmarks of shapes the table has not seen).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from triton_mm_sweep import FAMILIES, family_of  # noqa: E402

from cutetune.models.evaluate import geomean  # noqa: E402
from cutetune.models.triton_mm import TritonTable, fit, holdout, load_sweep, m_bucket  # noqa: E402
from cutetune.tuner.heuristics import Heuristics, default_path, predicted_triton_shapes  # noqa: E402


def summary(rows: list[dict]) -> dict:
    return {"shapes": len(rows),
            **{f"geomean_{k}": geomean([r[k] for r in rows])
               for k in ("vs_best_triton", "vs_aten", "vs_best")},
            "worst_vs_best": max(r["vs_best"] for r in rows),
            "share_within_1.1_of_best": sum(r["vs_best"] <= 1.1 for r in rows) / len(rows)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweep", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--arch", default="sm90")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--heldout-family", choices=list(FAMILIES))
    ap.add_argument("--heldout-heuristics")
    args = ap.parse_args()
    shapes = predicted_triton_shapes(load_sweep(args.sweep), args.arch, args.dtype)
    group = lambda s: family_of(s.n, s.k)  # noqa: E731
    rows = holdout(shapes, group)
    by_bucket = defaultdict(list)
    for r in rows:
        by_bucket[m_bucket(r["m"])].append(r)
    res = {"sweep": args.sweep, "arch": args.arch, "dtype": args.dtype,
           "shapes": len(shapes), "families": sorted({group(s) for s in shapes}),
           "picks_all_families": [p.to_json() for p in fit(shapes)],
           "heldout_by_m_bucket": {b: summary(rs) for b, rs in sorted(by_bucket.items())},
           "heldout_all": summary(rows), "heldout_rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps({k: res[k] for k in ("shapes", "families", "heldout_by_m_bucket",
                                          "heldout_all")}, indent=1))
    if args.heldout_heuristics:
        if not args.heldout_family:
            raise SystemExit("--heldout-heuristics needs --heldout-family")
        h = Heuristics.load(default_path(args.arch, args.dtype))
        h.triton = TritonTable.from_sweep([s for s in shapes
                                           if group(s) != args.heldout_family])
        h.meta = {**h.meta, "triton_heldout_family": args.heldout_family}
        print(f"wrote {h.save(args.heldout_heuristics)} (Triton table without "
              f"{args.heldout_family})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
