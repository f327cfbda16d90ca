"""Dense model files scored as they are on measured problems (``models.file_heldout.replay``
with every problem in one test split): each model's top-1 among a problem's measured configs
against the fastest of them, and predicted mode's decision (its top-1 or cuBLAS) against
cuBLAS, overall, per layout and per problem; the first two models' decisions also against
each other.

    python scripts/score_models.py DATASET --model NAME=PATH [--model NAME=PATH ...] --out FILE

PATH "shipped" is the packaged model of the dataset's dtype (the H200's); the H100's are in
cutetune/data/h100_sxm/ (cost_model_sm90_{bf16,fp16}.json.gz). A model scored on problems it trained
on is flattered: gpu_collect.sh's unseen stage measures shapes in no shipped model's data.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from cutetune.artifacts import write_artifact
from cutetune.models.artifact import load_model
from cutetune.models.data import load_measurements
from cutetune.models.evaluate import geomean
from cutetune.models.file_heldout import replay, summarize
from cutetune.models.heuristics import Heuristics, default_path

CLOSE = 0.01  # a decision this much faster than the other model's counts as a win


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset")
    ap.add_argument("--model", action="append", required=True, metavar="NAME=PATH")
    ap.add_argument("--out", required=True, help="JSON result path")
    args = ap.parse_args(argv)
    named = {}
    for m in args.model:
        name, sep, path = m.partition("=")
        if not (sep and name and path) or name in named:
            ap.error(f"--model {m!r}: give each model as a new NAME=PATH")
        named[name] = path
    data = load_measurements(args.dataset, "dense")
    first = data.problems[0]
    if len({(p.arch, p.dtype) for p in data.problems}) > 1:
        ap.error(f"{args.dataset} mixes archs or dtypes: a model scores one of each")
    grid = Heuristics.load(default_path(first.arch, first.dtype)).grid
    every = [(np.array([], dtype=int), np.arange(data.n_problems))]
    result: dict = {"command": " ".join(["python scripts/score_models.py", *(argv or sys.argv[1:])]),
                    "dataset": args.dataset, "device": data.device_name,
                    "problems": data.n_problems, "models": {}}
    decisions = {}
    for name, path in named.items():
        model = load_model(None if path == "shipped" else path, first.arch, first.dtype)
        rep = replay(data, lambda sub, m=model: m, every, grid)
        decisions[name] = rep.cublas_ms / rep.decision_ms("model")
        result["models"][name] = {
            "path": path, "summary": summarize(rep),
            "problems": [{"key": k, "top1_ms": t, "aten": bool(a), "decision_vs_cublas": d}
                         for k, t, a, d in zip(rep.keys, rep.model_ms.tolist(), rep.model_aten,
                                               decisions[name].tolist())]}
        s = result["models"][name]["summary"]
        print(f"{name}: top-1 {s['model_top1_vs_best']:.4f} (P10 {s['model_top1_vs_best_p10']:.4f}), "
              f"decision {s['model']['decision_vs_cublas']:.4f}x cuBLAS, keeps cuBLAS "
              f"{s['model']['keeps_cublas']} of {s['problems']}")
    if len(decisions) > 1:
        (a, da), (b, db) = list(decisions.items())[:2]
        result["first_over_second"] = {
            "models": [a, b], "decision_geomean": geomean(da / db),
            "first_faster": int(np.sum(da / db > 1 + CLOSE)),
            "second_faster": int(np.sum(db / da > 1 + CLOSE))}
        print(json.dumps(result["first_over_second"]))
    write_artifact(args.out, json.dumps(result, indent=1, allow_nan=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
