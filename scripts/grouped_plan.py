"""Split the grouped (MoE) suites into the problems `cutetune collect` times exhaustively and
those it samples, by their roofline time on the device: every valid config of the cheaper
problems fits a GPU call, a sample of the dearer ones does.

    python scripts/grouped_plan.py --out DIR [--device H200] [--exhaustive-ms 0.25]

writes DIR/exhaustive_<gemm>.json and DIR/sampled_<gemm>.json (the problems-file format of
`cutetune collect --problems`), and prints their counts. Deterministic: the H200 sessions run it
on the GPU host before collecting (scripts/gpu_collect.sh, stage grouped)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cutetune.space.device import DEVICES
from cutetune.space.problem import GROUPED_GEMMS
from cutetune.space.suites import grouped_suite


def roofline_ms(problem, device) -> float:
    return 1e3 * max(problem.flops / device.peak_flops(problem.dtype),
                     problem.min_bytes / device.mem_bw_bytes_per_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="H200")
    ap.add_argument("--suites", default="moe+moe_random")
    ap.add_argument("--exhaustive-ms", type=float, default=0.25,
                    help="problems whose roofline time is at most this are timed exhaustively")
    args = ap.parse_args()
    device = DEVICES[args.device]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for gemm in GROUPED_GEMMS:
        plan = {"exhaustive": [], "sampled": []}
        for name, p in grouped_suite(args.suites, arch=device.arch):
            if p.gemm == gemm:
                part = "exhaustive" if roofline_ms(p, device) <= args.exhaustive_ms else "sampled"
                plan[part].append({**p.to_dict(), "suite": name})
        for part, items in plan.items():
            items.sort(key=lambda d: d["m"] * d["n"] * d["k"])  # cheap first: a cut-off run
            (out / f"{part}_{gemm}.json").write_text(json.dumps(items, indent=0))  # keeps most
            print(f"{part}_{gemm}: {len(items)} problems")


if __name__ == "__main__":
    main()
