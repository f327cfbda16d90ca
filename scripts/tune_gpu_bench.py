#!/usr/bin/env python
"""Model-guided tuning on the GPU, of problems the shipped cost model never saw.

  run     (GPU host) `cutetune tune --backend gpu` once per problem, each in a fresh process
          with one cold kernel cache for the whole run (what a user pays), appending a JSON
          line per problem (config found, its time, cuBLAS timed in the same process, kernels
          built, wall time) and the measured rows to a dataset.
  report  (CPU) joins those lines with the exhaustive sweeps of the same problems in the
          dataset: the found config's time in the sweep against the sweep's best (same run),
          and the tuned time against cuBLAS.

The problems are the exhaustive suite's that the committed dataset lacks: the shipped model
was trained without them, and the collector sweeps every valid config of them.

cutetune must be importable: installed, or (as on the GPU host, which runs from an uninstalled
checkout) the repo root on PYTHONPATH, as below; the per-problem processes run from the root.

  PYTHONPATH=$PWD python scripts/tune_gpu_bench.py run --out $OUT/tune_runs.jsonl \
      --dataset /tmp/tune-data
  python scripts/tune_gpu_bench.py report --runs data/bench/tune_gpu_h200.jsonl \
      --dataset data/inputs/h200_bf16 --out data/reports/tune_gpu_h200
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from cutetune.models import dataset
from cutetune.models.evaluate import geomean
from cutetune.space.enumerate import enumerate_configs
from cutetune.space.suites import suite
from cutetune.tuner.search.backends import ReplayBackend
from cutetune.tuner.search.replay import exhaustive_problems

REPO = Path(__file__).resolve().parent.parent


def unseen_problems(trained_on: str | Path):
    """Exhaustive-suite problems with no row in ``trained_on`` (the shipped model's data)."""
    seen = set(dataset.load(trained_on, columns=["problem_key"]).column("problem_key").to_pylist())
    return [p for _, p in suite("exhaustive") if p.key() not in seen]


def _done(paths) -> set[str]:
    keys = set()
    for path in paths:
        if Path(path).is_file():
            keys |= {json.loads(line)["problem_key"]
                     for line in Path(path).read_text().splitlines() if line}
    return keys


def run(args) -> int:
    done = _done([args.out, *args.resume_from])  # a rerun goes on where earlier runs stopped
    todo = [p for p in unseen_problems(args.trained_on) if p.key() not in done]
    i, n = (int(x) for x in args.shard.split("/"))
    problems = todo[i::n][: args.limit]
    cache = Path(tempfile.mkdtemp(prefix="cutetune-tune-kernels-"))  # cold for this run
    env = {**os.environ, "QUACK_CACHE_DIR": str(cache), "CUTETUNE_CACHE": str(cache / "state")}
    deadline = time.monotonic() + args.budget_s
    print(f"{len(problems)} unseen problems; kernel cache {cache} (cold)", flush=True)
    for p in problems:
        if time.monotonic() + args.per_problem_s > deadline:
            print(f"budget: stopping before {p.key()}", flush=True)
            break
        cmd = [sys.executable, "-m", "cutetune", "tune", "--m", str(p.m), "--n", str(p.n),
               "--k", str(p.k), "--dtype", p.dtype, "--arch", p.arch, "--backend", "gpu",
               "--strategy", "model", "--dataset", args.dataset, "--results", args.out]
        cmd += ["--model", args.model] if args.model else []
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, env=env, cwd=REPO).returncode
        wall = time.perf_counter() - t0
        print(f"--- {p.key()}: rc {rc}, {wall:.1f} s in all", flush=True)
        if rc == 0:  # the process's own wall time, imports and worker start-up included
            lines = Path(args.out).read_text().splitlines()
            lines[-1] = json.dumps({**json.loads(lines[-1]), "process_wall_s": wall})
            Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


def _geomean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return geomean(xs) if xs else None


def report(args) -> int:
    runs = [json.loads(line) for line in Path(args.runs).read_text().splitlines() if line]
    backend = ReplayBackend(args.dataset)
    swept = {p.key() for p in exhaustive_problems(backend)}
    rows = []
    for run_ in runs:
        pk = run_["problem_key"]
        problem = dataset.problem_of(run_["problem"])
        n_valid = len(enumerate_configs(problem.arch, problem))
        sweep = {c.short(): t for c in backend.configs(problem)
                 if (t := backend.recorded(problem, c).time_ms) is not None}
        best_sweep = min(sweep.values()) if pk in swept else None
        in_sweep = sweep.get(run_["best_config"]) if pk in swept else None
        rows.append({
            "problem_key": pk, "m": problem.m, "n": problem.n, "k": problem.k,
            "best_config": run_["best_config"], "tuned_ms": run_["best_ms"],
            "cublas_ms": run_["cublas_ms"], "speedup_vs_cublas": run_["speedup_vs_cublas"],
            "kernels": run_["kernels"], "measured": run_["measured"],
            "compile_s": run_["compile_s"], "wall_s": run_["wall_s"],
            "process_wall_s": run_.get("process_wall_s"), "stop_reason": run_["stop_reason"],
            "swept_configs": len(sweep), "valid_configs": n_valid,
            "sweep_best_ms": best_sweep,
            # same sweep, same run: how close the config found is to the best of all
            "oracle_eff_in_sweep": best_sweep / in_sweep if in_sweep else None,
            # across runs (tuning vs sweep): includes run-to-run noise
            "oracle_eff_cross_run": best_sweep / run_["best_ms"] if best_sweep else None,
        })
    effs = [r["oracle_eff_in_sweep"] for r in rows if r["oracle_eff_in_sweep"]]
    summary = {
        "problems": len(rows), "with_sweep": len(effs),
        "models": dict(Counter(run_["model"] for run_ in runs)),
        "oracle_eff_in_sweep_geomean": _geomean(effs),
        "oracle_eff_in_sweep_min": min(effs) if effs else None,
        "reach_0.99": sum(e >= 0.99 for e in effs),
        "kernels_median": sorted(r["kernels"] for r in rows)[len(rows) // 2] if rows else None,
        "speedup_vs_cublas_geomean": _geomean(r["speedup_vs_cublas"] for r in rows),
        "wall_s_total": sum(r["wall_s"] for r in rows),
        "process_wall_s_total": sum(r["process_wall_s"] or 0 for r in rows),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = "python scripts/tune_gpu_bench.py report " + " ".join(
        f"--{k} {v}" for k, v in (("runs", args.runs), ("dataset", args.dataset), ("out", args.out)))
    cmd += f" --note {json.dumps(args.note)}" if args.note else ""
    (out / "report.json").write_text(json.dumps({"command": cmd, "summary": summary,
                                                 "rows": rows}, indent=1))
    fmt = lambda x, f="{:.3f}": "-" if x is None else f.format(x)  # noqa: E731
    lines = [
        "# Model-guided tuning on the H200, problems unseen by the shipped model", "",
        f"Made by `{cmd}` from the runs of `python scripts/tune_gpu_bench.py run` "
        "(each problem tuned by `cutetune tune --backend gpu --strategy model` in a fresh "
        "process, one cold kernel cache for the whole run).", "",
        "oracle eff. (sweep): the sweep's time of its best config over the sweep's time of the "
        "config tuning found (same collection run, so no run-to-run noise). vs cuBLAS: cuBLAS "
        "time over the tuned time, both timed in the tuning process. wall: the tuning call, "
        "compile and benchmark included; process: the whole command, imports included.", "",
        f"Cost models, as each run recorded them (runs): {summary['models']}. {args.note}", "",
        "| problem | found | kernels | wall s | process s | tuned ms | vs cuBLAS | "
        "oracle eff. (sweep) | sweep configs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| m{r['m']} n{r['n']} k{r['k']} | `{r['best_config']}` | {r['kernels']} | "
            f"{r['wall_s']:.1f} | {fmt(r['process_wall_s'], '{:.1f}')} | "
            f"{fmt(r['tuned_ms'], '{:.4f}')} | {fmt(r['speedup_vs_cublas'])} | "
            f"{fmt(r['oracle_eff_in_sweep'])} | {r['swept_configs']}/{r['valid_configs']} |")
    s = summary
    lines += ["", f"{s['problems']} problems, {s['with_sweep']} with a full sweep: oracle "
              f"efficiency geomean {fmt(s['oracle_eff_in_sweep_geomean'])}, min "
              f"{fmt(s['oracle_eff_in_sweep_min'])}, {s['reach_0.99']} at >= 0.99; median "
              f"{s['kernels_median']} kernels built; tuned vs cuBLAS geomean "
              f"{fmt(s['speedup_vs_cublas_geomean'])}; {s['wall_s_total']:.0f} s of tuning "
              f"({s['process_wall_s_total']:.0f} s of processes) in all.", ""]
    (out / "report.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True, help="JSON lines, one per tuned problem")
    r.add_argument("--dataset", required=True, help="dataset the measurements are appended to")
    r.add_argument("--trained-on", default=str(REPO / "data" / "inputs" / "h200_bf16"))
    r.add_argument("--limit", type=int, default=None)
    r.add_argument("--model", default=None, help="cost model file (default: the packaged one)")
    r.add_argument("--resume-from", nargs="*", default=[], metavar="JSONL",
                   help="earlier runs' lines: their problems are not tuned again")
    r.add_argument("--shard", default="0/1", metavar="I/N",
                   help="take every N-th problem left, from the I-th (one shard per GPU)")
    r.add_argument("--budget-s", type=float, default=420.0)
    r.add_argument("--per-problem-s", type=float, default=40.0,
                   help="time a problem is expected to take: none starts past the budget")
    r.set_defaults(func=run)
    p = sub.add_parser("report")
    p.add_argument("--runs", required=True)
    p.add_argument("--dataset", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--note", default="", help="a sentence on the runs, copied into the report")
    p.set_defaults(func=report)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
