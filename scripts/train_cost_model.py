"""Train a shipped cost model on its measured H200 bf16 dataset and write its report.

    python scripts/train_cost_model.py [--shipped dense|grouped] [DATASET] [--out FILE]
        [--report DIR] [train options]

Defaults per shipped model (``SHIPPED``): dense, data/inputs/h200_bf16 ->
cutetune/data/cost_model_sm90_bf16.json and data/reports/model_h200_bf16/; grouped (MoE expert
GEMMs), data/inputs/h200_bf16_grouped -> cutetune/data/cost_model_sm90_bf16_grouped.json and
data/reports/model_h200_bf16_grouped/ (report.md, metrics.json, plots). The options are those
of `cutetune train`.
"""

from __future__ import annotations

import argparse
import sys

from cutetune.models.dataset import DatasetError
from cutetune.commands.train import add_arguments, options_from, run


# shipped model -> (dataset, model file, report folder)
SHIPPED = {
    "dense": ("data/inputs/h200_bf16", "cutetune/data/cost_model_sm90_bf16.json",
              "data/reports/model_h200_bf16"),
    "grouped": ("data/inputs/h200_bf16_grouped",
                "cutetune/data/cost_model_sm90_bf16_grouped.json",
                "data/reports/model_h200_bf16_grouped"),
}


def main(argv: list[str] | None = None) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--shipped", choices=tuple(SHIPPED), default="dense")
    known, rest = pre.parse_known_args(argv)
    dataset, out, report = SHIPPED[known.shipped]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], parents=[pre])
    add_arguments(p, dataset=dataset, out=out, report=report)
    args = p.parse_args(argv)
    try:
        run(args.dataset, args.out, args.report, options_from(args), args.kind or known.shipped)
    except (ValueError, FileNotFoundError, DatasetError) as e:
        print(f"train_cost_model: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
