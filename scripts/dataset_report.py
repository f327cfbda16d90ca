"""Report on a measured dataset: counts, failures, timing noise, the best config against the
ATen baseline (cuBLAS's torch.mm; torch._grouped_mm for grouped problems) by M and by the
operands' majors, the worst config against the best.

    python scripts/dataset_report.py --data data/inputs/h200_bf16 \
        --repeat data/bench/h200_bf16_repeat \
        --stats data/reports/collect_stats --out data/reports/dataset_h200_bf16

Writes OUT.md, OUT.json and OUT.png (best-config speedup over ATen against M, or for grouped
problems against the routed rows).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from cutetune.models import dataset
from cutetune.models.evaluate import M_BUCKETS, bucket_name, geomean, m_bucket
from cutetune.space import enumerate_configs
from cutetune.models.kinds import kind_of
from cutetune.space.problem import layout_name
from cutetune.tuner.measure.timing import UNSTABLE_SPREAD


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="data/inputs/h200_bf16")
    ap.add_argument("--repeat", default="data/bench/h200_bf16_repeat")
    ap.add_argument("--stats", nargs="+", default=["data/reports/collect_stats"],
                    help="folders of `cutetune collect --stats` files")
    ap.add_argument("--out", default="data/reports/dataset_h200_bf16")
    ap.add_argument("--min-configs", type=int, default=150,
                    help="problems with at least this many measured configs enter the comparison")
    args = ap.parse_args()
    rows = dataset.load(args.data).to_pylist()
    quack = [r for r in rows if r["backend"] == "quack"]
    cublas = {identity(r): r for r in rows
              if r["backend"] == kind_of(dataset.problem_of(r)).baseline_backend
              and r["status"] == "ok"}
    problems = {}
    for r in quack:
        problems.setdefault(identity(r), []).append(r)
    n_valid = {}
    for key, rs in problems.items():
        p = dataset.problem_of(rs[0])
        n_valid[key] = len(enumerate_configs(p.arch, p))
    exhaustive = [k for k, rs in problems.items() if len(rs) >= n_valid[k]]
    sampled = [k for k, rs in problems.items() if len(rs) >= min(args.min_configs, n_valid[k])]
    status = {}
    for r in rows:
        status[r["status"]] = status.get(r["status"], 0) + 1
    failures = {}
    for r in rows:
        if r["status"] != "ok":
            kind = (r["error"] or "").split(":")[0][:60]
            failures.setdefault(r["status"], {}).setdefault(kind, 0)
            failures[r["status"]][kind] += 1

    # Best config vs the ATen baseline, per problem with at least --min-configs measured configs;
    # a grouped problem by its routed rows (the ragged dimension).
    speed, spread_all, by_layout = [], [], {}
    for key in sampled:
        ok = [r["time_ms"] for r in problems[key] if r["status"] == "ok"]
        p = dataset.problem_of(problems[key][0])
        size = kind_of(p).size(p)
        if ok and key in cublas:
            speed.append((size, cublas[key]["time_ms"] / min(ok), key in exhaustive))
            by_layout.setdefault(layout_name(p), []).append(speed[-1][1])
        if ok and key in exhaustive:
            spread_all.append(max(ok) / min(ok))
    by_bucket = {}
    for m, s, _ in speed:
        by_bucket.setdefault(int(m_bucket(m)), []).append(s)
    speed_table = {bucket_name(*M_BUCKETS[i]): speed_summary(v)
                   for i, v in sorted(by_bucket.items())}

    # Timing noise: the same (problem, config) measured twice, minutes apart.
    noise = {}
    if args.repeat and Path(args.repeat).exists():
        first = {dataset.row_key(r): r["time_ms"] for r in rows if r["status"] == "ok"}
        again = [r for r in dataset.load(args.repeat).to_pylist()
                 if r["status"] == "ok" and dataset.row_key(r) in first]
        diffs = [abs(r["time_ms"] - first[dataset.row_key(r)]) / first[dataset.row_key(r)]
                 for r in again]
        configs = {}  # problem -> [(first time, repeat time, problem)] of its quack configs
        for r in again:
            if r["backend"] == "quack":
                configs.setdefault(identity(r), []).append(
                    (first[dataset.row_key(r)], r["time_ms"], dataset.problem_of(r)))
        if diffs:
            noise = {"pairs": len(diffs), "median_rel_diff": float(np.median(diffs)),
                     "p90_rel_diff": float(np.quantile(diffs, 0.9)), "max_rel_diff": float(max(diffs)),
                     "first_best_in_repeat": repeat_top1(configs)}
    ok_rows = [r for r in rows if r["status"] == "ok"]
    spread = np.array([(r["time_ms_p80"] - r["time_ms_p20"]) / r["time_ms"] for r in ok_rows])
    stats = {p.stem: json.loads(p.read_text()) for folder in args.stats
             for p in sorted(Path(folder).glob("*.json"))}
    report = {
        "rows": len(rows), "problems": len(problems), "cublas_baselines": len(cublas),
        "problems_with_150_configs": len(sampled), "exhaustive_problems": len(exhaustive),
        "status": status, "failures": failures,
        "within_measurement_spread_p80_p20_over_median": {
            "median": float(np.median(spread)), "p90": float(np.quantile(spread, 0.9)),
            "above_half": int((spread > UNSTABLE_SPREAD).sum())},  # too unstable to rank by
        "repeat_noise": noise, "best_over_cublas_by_m": speed_table,
        "best_over_cublas_by_layout": {k: speed_summary(v) for k, v in sorted(by_layout.items())},
        "best_over_cublas_geomean": geomean([s for _, s, _ in speed]),
        "worst_over_best_exhaustive": ({"problems": len(spread_all), "geomean": geomean(spread_all),
                                        "min": min(spread_all), "max": max(spread_all)}
                                       if spread_all else {}),
        "collect_stats": stats,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    write_markdown(out.with_suffix(".md"), report, args)
    plot(out.with_suffix(".png"), speed)
    print(out.with_suffix(".md").read_text())


def repeat_top1(configs: dict) -> dict:
    """The first run's fastest of a problem's twice-measured configs, timed in the repeat,
    over the repeat's fastest of them: the top-1 that timing noise alone allows, by layout
    (the fewer configs a problem shares, the nearer 1)."""
    by_layout = {}
    for v in configs.values():
        if len(v) > 1:
            a, b = np.array([x[0] for x in v]), np.array([x[1] for x in v])
            by_layout.setdefault(layout_name(v[0][2]), []).append(
                (b.min() / b[a.argmin()], len(v)))
    def summary(vals):
        r = np.array([x for x, _ in vals])
        return {"problems": len(r), "configs_median": float(np.median([n for _, n in vals])),
                "geomean": geomean(r), "p10": float(np.quantile(r, 0.1)), "min": float(r.min())}
    return {k: summary(v) for k, v in sorted(by_layout.items())}


def speed_summary(ratios: list[float]) -> dict:
    """ATen time over the best config's, of a set of problems."""
    return {"problems": len(ratios), "geomean": geomean(ratios), "min": min(ratios),
            "max": max(ratios), "share_faster": float(np.mean(np.array(ratios) > 1))}


def speed_rows(table: dict) -> list[str]:
    """The markdown rows of a ``speed_summary`` per group."""
    return [f"| {b} | {v['problems']} | {v['geomean']:.3f} | {v['min']:.3f} | {v['max']:.3f} | "
            f"{v['share_faster']:.2f} |" for b, v in table.items()]


def identity(r: dict) -> str:
    """The row's problem (a grouped shape's routings are problems of their own)."""
    return dataset.problem_identity(r["problem_key"], r["expert_counts"])


def write_markdown(path: Path, rep: dict, args) -> None:
    lines = [
        f"# Dataset report: `{args.data}`",
        "",
        f"Made by `python scripts/dataset_report.py --data {args.data} --repeat "
        f"{args.repeat or chr(39) * 2} --stats {' '.join(args.stats)} --out {args.out} --min-configs "
        f"{args.min_configs}`.",
        "",
        "## Counts",
        f"- rows: {rep['rows']}; problems: {rep['problems']}; ATen baselines: {rep['cublas_baselines']}",
        f"- problems with >= {args.min_configs} measured configs: {rep['problems_with_150_configs']}",
        f"- problems with every valid config measured (exhaustive): {rep['exhaustive_problems']}",
        f"- status: {rep['status']}",
        f"- failures by kind: {rep['failures'] or 'none'}",
        "",
        "## Timing noise",
        f"- spread within a measurement, (p80 - p20) / median: median "
        f"{rep['within_measurement_spread_p80_p20_over_median']['median']:.4f}, p90 "
        f"{rep['within_measurement_spread_p80_p20_over_median']['p90']:.4f}; above {UNSTABLE_SPREAD:g} in "
        f"{rep['within_measurement_spread_p80_p20_over_median']['above_half']} rows",
    ]
    n = rep["repeat_noise"]
    if n:
        lines.append(f"- same (problem, config) measured again in a later run ({n['pairs']} pairs): "
                     f"median relative difference {n['median_rel_diff']:.4f}, p90 "
                     f"{n['p90_rel_diff']:.4f}, max {n['max_rel_diff']:.4f}")
        for layout, t in n["first_best_in_repeat"].items():
            lines.append(f"- {layout}: the first run's fastest config, timed again, at {t['geomean']:.4f} "
                         f"of the repeat's fastest of the same configs (P10 {t['p10']:.4f}, min "
                         f"{t['min']:.4f}; {t['problems']} problems, median "
                         f"{t['configs_median']:.0f} configs each)")
    w = rep["worst_over_best_exhaustive"]
    if w:
        lines.append(f"- worst over best config, exhaustive problems ({w['problems']}): geomean "
                     f"{w['geomean']:.2f}x, {w['min']:.2f}x to {w['max']:.2f}x")
    lines += ["", "## Best measured config vs ATen (torch.mm, or torch._grouped_mm), by M "
              "(grouped: routed rows)",
              f"Geomean over all problems: {rep['best_over_cublas_geomean']:.3f}x "
              "(>1: the best CuteDSL config is faster).", "",
              "| M | problems | geomean | min | max | share faster |", "|---|---|---|---|---|---|"]
    lines += speed_rows(rep["best_over_cublas_by_m"])
    lines += ["", "By layout, A's and B's majors (kk is a linear layer's forward, kn its input "
              "gradient, mn its weight gradient; bmm a batched problem):", "",
              "| layout | problems | geomean | min | max | share faster |",
              "|---|---|---|---|---|---|", *speed_rows(rep["best_over_cublas_by_layout"])]
    if rep["collect_stats"]:
        lines += ["", "## Collection throughput (H200 host, 16 cores)", "",
                  "| run | measured | per min | kernels compiled | compiled per min | GPU busy |",
                  "|---|---|---|---|---|---|"]
        for name, s in rep["collect_stats"].items():
            lines.append(f"| {name} | {s['measured']} | {s['measurements_per_min']:.0f} | "
                         f"{s['kernels_compiled']} | {s['kernels_compiled_per_min']:.0f} | "
                         f"{s['gpu_busy_fraction']:.2f} |")
    lines += ["", "![best over cuBLAS](" + path.with_suffix(".png").name + ")", ""]
    path.write_text("\n".join(lines))


def plot(path: Path, speed) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for exh, color, label in ((False, "tab:blue", "sampled configs"),
                              (True, "tab:red", "exhaustive")):
        pts = [(m, s) for m, s, e in speed if e == exh]
        if pts:
            ax.scatter(*zip(*pts), s=12, c=color, label=label, alpha=0.7)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M")
    ax.set_ylabel("ATen time / best CuteDSL time")
    ax.set_title("H200 bf16: best measured quack config vs ATen")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
