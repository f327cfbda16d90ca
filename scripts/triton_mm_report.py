#!/usr/bin/env python
"""How well one Triton mm config per M bucket serves shapes it was not fitted on.

From a Triton sweep (scripts/triton_mm_sweep.py), the shapes predicted mode asks about
(host-bound and memory-bound: tuner.heuristics.predicted_triton_shapes), each model family
held out in turn: its shapes get the bucket picks fitted on the other families
(models.triton_mm.holdout), timed by the sweep's own measurements against the fastest Triton
config. With --retimed (scripts/triton_mm_retime.py): the picks' and ATen's L2-cold GPU
times, how far the sweep's own times of them were off, and how well the launch costs' GPU-time
model (models.triton_mm.fit_launch_costs) predicts each family when fitted without it.

  python scripts/triton_mm_report.py --sweep data/inputs/triton_mm/h200_bf16.jsonl.gz \\
      --retimed data/bench/triton_mm/h200_bf16_retimed.jsonl.gz \\
      --out data/reports/triton_mm_h200_bf16.json \\
      [--heldout-family llama3_8b --heldout-heuristics /tmp/heldout.json]

With --heldout-heuristics, also writes the packaged heuristics with a Triton table fitted
without that family (for step benchmarks of shapes the table has not seen).
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

from benchlib import FAMILIES, family_of

from cutetune.models.evaluate import geomean
from cutetune.models.triton_mm import (StepHostCosts, TritonTable, fastest_retimed, fit,
    fit_launch_costs, holdout, load_retimed, load_sweep, m_bucket)
from cutetune.models.heuristics import Heuristics, default_path, predicted_triton_shapes


def summary(rows: list[dict]) -> dict:
    ratios = [r["vs_best_triton"] for r in rows]
    return {"shapes": len(rows), "geomean_vs_best_triton": geomean(ratios),
            "worst_vs_best_triton": max(ratios),
            "share_within_1.1_of_best_triton": sum(x <= 1.1 for x in ratios) / len(ratios)}


NO_HOST = StepHostCosts(0.0, 0.0, (1.0, 1.0))  # GPU times only


def retimed_report(path: str, sweep: list) -> dict:
    """The retimed picks against ATen, the sweep's times against the retimed ones, and the
    GPU-time model's error on each family when fitted without it (host costs do not enter)."""
    retimed = load_retimed(path)
    picks = [r for r in retimed if r.variant == "pick"]
    fastest = fastest_retimed(retimed)
    swept = {(s.m, s.n, s.k, s.majors): s for s in sweep}
    key = lambda r: (r.problem.m, r.problem.n, r.problem.k,  # noqa: E731
                     r.problem.a_major + r.problem.b_major)
    fam = lambda r: family_of(r.problem.n, r.problem.k)  # noqa: E731
    errors = {"aten": [], "triton": []}
    for f in sorted({fam(r) for r in retimed}):
        costs = fit_launch_costs([r for r in retimed if fam(r) != f], NO_HOST)
        for r in (r for r in picks if fam(r) == f):
            for kind, measured in (("aten", r.aten_us), ("triton", r.triton_us)):
                errors[kind].append(math.log(costs.gpu_us(r.problem, r.config, kind == "triton")
                                             / measured))
    pick_vs_aten = [r.triton_us / r.aten_us for r in picks]
    fastest_vs_aten = [r.triton_us / r.aten_us for r in fastest.values()]
    by_variant = {(r.problem, r.variant): r.triton_us for r in retimed}
    best_vs_pick = [us / by_variant[p, "pick"] for (p, v), us in by_variant.items()
                    if v == "sweep_best" and (p, "pick") in by_variant]
    return {"retimed": path, "shapes": len(picks),
            "geomean_pick_vs_aten": geomean(pick_vs_aten),
            "share_pick_faster_than_aten": sum(x < 1 for x in pick_vs_aten) / len(picks),
            # the config the heuristics give a retimed shape (in-sample: chosen on these times)
            "fastest_retimed": {"geomean_vs_aten": geomean(fastest_vs_aten),
                                "share_faster_than_aten":
                                    sum(x < 1 for x in fastest_vs_aten) / len(fastest),
                                "not_the_pick": sum(r.variant != "pick"
                                                    for r in fastest.values())},
            "sweep_over_retimed_aten": _spread([swept[key(r)].aten_ms * 1e3 / r.aten_us
                                                for r in picks if swept[key(r)].aten_ms]),
            "sweep_over_retimed_triton": _spread([swept[key(r)].triton_ms[r.config] * 1e3
                                                  / r.triton_us for r in retimed]),
            # where the sweep's fastest config was not the pick: that config, retimed
            "sweep_fastest_over_pick": {**_spread(best_vs_pick), "shapes": len(best_vs_pick),
                                        "faster": sum(x < 1 for x in best_vs_pick)},
            "gpu_time_model_heldout_family": {
                kind: {"rmse_log": math.sqrt(sum(e * e for e in es) / len(es)),
                       "max_abs_log": max(abs(e) for e in es)} for kind, es in errors.items()}}


def _spread(xs: list[float]) -> dict:
    return {"geomean": geomean(xs), "min": min(xs), "max": max(xs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweep", required=True)
    ap.add_argument("--retimed", help="scripts/triton_mm_retime.py output")
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
           "heldout_all": summary(rows), "heldout_rows": rows,
           **({"retimed": retimed_report(args.retimed, shapes)} if args.retimed else {})}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps({k: res[k] for k in ("shapes", "families", "heldout_by_m_bucket",
                                          "heldout_all", "retimed") if k in res}, indent=1))
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
