"""Train the shipped cost model on the measured H200 bf16 dataset and write its report.

    python scripts/train_cost_model.py [DATASET] [--out FILE] [--report DIR] [train options]

Defaults: data/inputs/h200_bf16 -> cutetune/data/cost_model_sm90_bf16.json (the model
load_model() loads by default) and data/reports/model_h200_bf16/ (report.md, metrics.json,
plots). The options are those of `cutetune train`.
"""

from __future__ import annotations

import argparse
import sys

from cutetune.models.dataset import DatasetError
from cutetune.commands.train import add_arguments, options_from, run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p, dataset="data/inputs/h200_bf16",
                  out="cutetune/data/cost_model_sm90_bf16.json",
                  report="data/reports/model_h200_bf16")
    args = p.parse_args(argv)
    try:
        run(args.dataset, args.out, args.report, options_from(args), args.kind)
    except (ValueError, FileNotFoundError, DatasetError) as e:
        print(f"train_cost_model: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
