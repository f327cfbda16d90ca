"""Train a shipped cost model on its measured dataset and write its report.

    python scripts/train_cost_model.py [--shipped dense|fp16|h100|h100_fp16|grouped] [DATASET]
        [--out FILE] [--report DIR] [train options]
    python scripts/train_cost_model.py --shipped grouped --picks-only [--out FILE]

Defaults per shipped model (``SHIPPED``): dense, data/inputs/h200_bf16, its fits joined by
data/inputs/h200_fp16 (--also) -> cutetune/data/cost_model_sm90_bf16.json.gz and
data/reports/model_h200_bf16/; fp16 (dense),
data/inputs/h200_fp16, its fits joined by data/inputs/h200_bf16 (--also) ->
cutetune/data/cost_model_sm90_fp16.json.gz and data/reports/model_h200_fp16/; h100 (dense, the
H100's own: configs rank differently there), data/inputs/h100_bf16 joined by
data/inputs/h100_fp16 -> cutetune/data/h100_sxm/cost_model_sm90_bf16.json.gz and
data/reports/model_h100_bf16/; h100_fp16 (dense, the H100's fp16), data/inputs/h100_fp16
joined by data/inputs/h100_bf16 -> cutetune/data/h100_sxm/cost_model_sm90_fp16.json.gz and
data/reports/model_h100_fp16/; grouped (MoE
expert GEMMs), data/inputs/h200_bf16_grouped ->
cutetune/data/cost_model_sm90_bf16_grouped.json.gz and data/reports/model_h200_bf16_grouped/
(report.md, metrics.json, plots). The options are those of `cutetune train`. The grouped
model's file then keeps its picks for every MoE model's expert GEMMs at every rung of the
routed rows (``moe_rung_problems``), which a compile reads without loading the model
(``grouped_mm.Picker``); ``--picks-only`` writes them into the file as it is.
"""

from __future__ import annotations

import argparse
import sys

from cutetune.models.artifact import load_model
from cutetune.models.dataset import DatasetError
from cutetune.settings import model_file_name
from cutetune.commands.train import add_arguments, also_from, options_from, run
from cutetune.space.problem import GROUPED_GEMMS
from cutetune.space.suites import MOE_MODELS, expert_gemm, expert_projections
from cutetune.tuner.kernels.grouped_mm import RAGGED_RUNGS


# shipped model -> (dataset, model file, report folder, kind, the same GPU's other dtype's data
# joining its fits: bf16's ten times as many backward problems for fp16; fp16's problems, which
# lift bf16's held-out top-1 and P10 on two CV splits: data/reports/bf16_join_h200.json.gz)
SHIPPED = {
    "dense": ("data/inputs/h200_bf16", f"cutetune/data/{model_file_name('sm90', 'bf16')}",
              "data/reports/model_h200_bf16", "dense", "data/inputs/h200_fp16"),
    "fp16": ("data/inputs/h200_fp16", f"cutetune/data/{model_file_name('sm90', 'fp16')}",
             "data/reports/model_h200_fp16", "dense", "data/inputs/h200_bf16"),
    "h100": ("data/inputs/h100_bf16",
             f"cutetune/data/h100_sxm/{model_file_name('sm90', 'bf16')}",
             "data/reports/model_h100_bf16", "dense", "data/inputs/h100_fp16"),
    "h100_fp16": ("data/inputs/h100_fp16",
                  f"cutetune/data/h100_sxm/{model_file_name('sm90', 'fp16')}",
                  "data/reports/model_h100_fp16", "dense", "data/inputs/h100_bf16"),
    "grouped": ("data/inputs/h200_bf16_grouped",
                f"cutetune/data/{model_file_name('sm90', 'bf16', 'grouped')}",
                "data/reports/model_h200_bf16_grouped", "grouped", None),
}


def moe_rung_problems() -> list:
    """Every MoE model's expert GEMMs (both projections; forward, input and weight gradient)
    at each rung of the routed rows that a compile asks picks for (``RAGGED_RUNGS``)."""
    return list(dict.fromkeys(
        expert_gemm(gemm, layer.experts, rows, n, k) for layer in MOE_MODELS.values()
        for n, k in expert_projections(layer).values() for gemm in GROUPED_GEMMS
        for rows in RAGGED_RUNGS))


def main(argv: list[str] | None = None) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--shipped", choices=tuple(SHIPPED), default="dense")
    pre.add_argument("--picks-only", action="store_true",
                     help="grouped: write the picks into the model file as it is, no training")
    known, rest = pre.parse_known_args(argv)
    dataset, out, report, kind, also = SHIPPED[known.shipped]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], parents=[pre])
    add_arguments(p, dataset=dataset, out=out, report=report, also=also)
    args = p.parse_args(argv)
    if args.picks_only and known.shipped != "grouped":
        p.error("--picks-only is for the grouped model")
    try:
        if not args.picks_only:
            run(args.dataset, args.out, args.report, options_from(args), args.kind or kind,
                also_from(args))
        if known.shipped == "grouped":
            load_model(args.out, kind="grouped").with_picks(moe_rung_problems()).save(args.out)
    except (ValueError, FileNotFoundError, DatasetError) as e:
        print(f"train_cost_model: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
