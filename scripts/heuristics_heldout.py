"""The heuristics file against its model on held-out problems (``models.file_heldout``): per
CV fold of the dataset, a model trained as `cutetune train` trains the shipped one, without
the fold; its top-1 and fallback decision, the file's from the same model (the grid of
``--heuristics``), and cuBLAS, scored with the measured times.

    python scripts/heuristics_heldout.py [--data data/inputs/h200_bf16]
        [--heuristics cutetune/data/heuristics_sm90_bf16.json.gz] [--objectives OBJ ...]
        [--also DATASET] [--folds 5] [--seed 0] --out FILE

--also joins another dtype's dataset to every fit as `cutetune train --also` does (the
shipped models': bf16's data/inputs/h200_fp16, fp16's data/inputs/h200_bf16), less the held-out
fold's layers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from cutetune import progress
from cutetune.artifacts import write_artifact
from cutetune.models.data import load_measurements
from cutetune.models.file_heldout import TARGETS, replay, summarize
from cutetune.models.heuristics import Heuristics, default_path
from cutetune.models.train import TrainOptions, train


def _extra_without(extra, data, sub):
    """``extra`` less the layers of ``data``'s problems that ``sub`` (a fold's training
    problems) holds out."""
    if extra is None:
        return None
    kept = set(sub.problems)
    return extra.subset(extra.unlike([p for p in data.problems if p not in kept]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="data/inputs/h200_bf16")
    ap.add_argument("--heuristics", default=str(default_path("sm90", "bf16")),
                    help="the file whose grid is replayed")
    ap.add_argument("--objectives", nargs="+",
                    help="objectives each fold's training chooses among (default: the dense "
                    "kind's, as `cutetune train`)")
    ap.add_argument("--also", metavar="DATASET", default=None,
                    help="another dtype's dataset joining every fit (cutetune train --also)")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True, help="JSON result path")
    args = ap.parse_args(argv)

    data = load_measurements(args.data, "dense")
    extra = load_measurements(args.also, "dense") if args.also else None
    grid = Heuristics.load(args.heuristics).grid
    options = TrainOptions(folds=args.folds, seed=args.seed,
                           objectives=tuple(args.objectives) if args.objectives else None,
                           baselines=False, family_out=False,
                           threads=args.threads).for_kind("dense")
    splits = data.folds(args.folds, args.seed)
    t0 = time.perf_counter()
    with progress.bar(len(splits), "folds", unit="fold") as bar:
        rep = replay(data, lambda sub: train(sub, options, _extra_without(extra, data, sub))[0],
                     splits, grid, bar.update)
    result = {"command": " ".join(["python scripts/heuristics_heldout.py", *(argv or sys.argv[1:])]),
              "data": args.data, "heuristics": args.heuristics, "grid": grid.to_json(),
              "options": {"folds": args.folds, "seed": args.seed,
                          "objectives": list(options.objectives), "also": args.also},
              "targets": TARGETS, "summary": summarize(rep), "seconds": time.perf_counter() - t0,
              "problems": [{"key": k, "model_ms": m, "model_aten": bool(ma), "file_ms": f,
                            "file_aten": bool(fa), "cublas_ms": c, "on_grid": bool(g)}
                           for k, m, ma, f, fa, c, g in zip(
                               rep.keys, rep.model_ms.tolist(), rep.model_aten, rep.file_ms.tolist(),
                               rep.file_aten, rep.cublas_ms.tolist(), rep.on_grid)]}
    write_artifact(args.out, json.dumps(result, indent=1, allow_nan=True))
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
