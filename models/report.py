"""The evaluation report of `cutetune train`: report.md, metrics.json and PNG plots.

metrics.json holds every number the markdown shows, so a figure quoted elsewhere can cite it.
Plots need matplotlib; without it the report says so and keeps the tables.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np

from ..artifacts import write_atomic
from .evaluate import M_BUCKETS, NDCG_K, bucket_name
from .fallback import REGRESSION
from .train import RANKER_MARGIN, Evaluation

TARGETS = {"top1_geomean": 0.97, "top1_p10": 0.92, "top5_geomean": 0.99}


def _f(x, digits: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _pct(x) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f}%"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *["| " + " | ".join(r) + " |" for r in rows]]


def _order(ev: Evaluation) -> list[str]:
    """The shipped model first, then the other XGBoost variants, then the baselines."""
    names = list(ev.cv)
    return [ev.chosen] + [n for n in names if n != ev.chosen]


def _method_table(ev: Evaluation, subset: str) -> list[str]:
    """The CV metrics of every method on the "all" or "swept" problems."""
    mask = ev.swept if subset == "swept" else np.ones(len(ev.swept), bool)
    rows = []
    for n in _order(ev):
        a, h = ev.cv_summary[n][subset], ev.cv[n]
        rank = h.method.ranks
        cov = _pct(float(np.mean(h.coverage[mask]))) if h.coverage is not None else "—"
        rows.append([n, _f(a["top1_geomean"]), _f(a["top1_p10"]), _f(a["top1_min"]),
                     _f(a["top5_geomean"]) if rank else "—", _f(a["top10_geomean"]) if rank else "—",
                     _f(a["kendall_tau"]) if rank else "—", _f(a[f"ndcg@{NDCG_K}"]) if rank else "—",
                     _f(a["vs_cublas_geomean"]), _pct(a["beats_cublas_frac"]), cov])
    return _table(["method", "top-1 geomean", "top-1 P10", "top-1 min", "top-5 geomean",
                   "top-10 geomean", "Kendall tau", f"NDCG@{NDCG_K}", "top-1 vs cuBLAS",
                   "top-1 beats cuBLAS", "own pick measured"], rows)


def markdown(ev: Evaluation, metadata: dict, plots: list[str], note: str) -> str:
    data = metadata.get("trained_on", {})
    out = [f"# Cost model evaluation: {ev.arch} {ev.dtype} on {ev.device}", "",
           f"Dataset: `{data.get('dataset', '?')}` (sha256 `{str(data.get('sha256', '?'))[:16]}…`): "
           f"{ev.problems} problems ({int(ev.swept.sum())} fully swept), {ev.rows} ok quack rows "
           f"({ev.failed_rows} failed rows left out), families: " + ", ".join(f"{k} ({v})" for k, v in ev.families.items()) + ".",
           f"Shipped model: **{ev.chosen}** (regression unless a ranking objective beats its "
           f"held-out top-1 geomean by more than {RANKER_MARGIN}). Packages: " + ", ".join(f"{k} {v}" for k, v in
                                                 metadata.get("packages", {}).items()) + ".", "",
           "Oracle efficiency = t_best / t_chosen per problem, t_best the fastest measured ok "
           "config of the problem (the candidates are the measured configs). top-k = best "
           "measured time among the k first picks. vs cuBLAS = t_cuBLAS / t_top1 (> 1: faster "
           "than torch.mm). All numbers are on problems the model did not train on.", ""]

    s = ev.cv_summary[ev.chosen]["all"]
    checks = [f"{k} {_f(s[k])} {'>=' if s[k] >= v else '<'} {v} "
              f"({'met' if s[k] >= v else 'NOT met'})" for k, v in TARGETS.items()]
    out += ["Targets: " + "; ".join(checks) + ".", ""]

    out += [f"## Problem-grouped {metadata.get('cv_folds', '?')}-fold cross-validation", ""]
    out += _method_table(ev, "all")
    out += ["", "Methods: " + "; ".join(f"**{n}**: {ev.cv[n].method.description}"
                                         for n in _order(ev)) + ".",
            "", "*own pick measured*: share of problems whose heuristic pick (quack_autotune: its "
            "whole list) was among the measured configs; elsewhere the nearest measured config "
            "stood in for it, so the heuristic rows are exact only on fully swept problems.", ""]
    if "swept" in ev.cv_summary[ev.chosen]:
        out += [f"### Fully swept problems ({int(ev.swept.sum())}: every valid config measured)", "",
                "Here t_best is the best of the whole valid space and every heuristic's pick was "
                "measured exactly.", ""] + _method_table(ev, "swept") + [""]

    out += ["### By M bucket (top-1 geomean / P10 / best-of-top-5 geomean)", ""]
    buckets = [bucket_name(lo, hi) for lo, hi in M_BUCKETS]
    present = [b for b in buckets if b in ev.cv_summary[ev.chosen]]
    rows = []
    for n in _order(ev):
        cells = []
        for b in present:
            x = ev.cv_summary[n][b]
            top5 = _f(x["top5_geomean"]) if ev.cv[n].method.ranks else "—"
            cells.append(f"{_f(x['top1_geomean'])} / {_f(x['top1_p10'])} / {top5}")
        rows.append([n] + cells)
    counts = [f"{b} ({ev.cv_summary[ev.chosen][b]['problems']})" for b in present]
    out += _table(["method"] + counts, rows) + [""]

    if ev.lofo_summary:
        out += ["## Leave-one-family-out (top-1 geomean / P10)", "",
                "Each family (suite) is held out whole: the learned models train on the others.", ""]
        methods = [n for n in _order(ev) if n in ev.lofo_summary]
        fams = list(next(iter(ev.lofo_summary.values())))
        rows = [[f"{fam} ({ev.lofo_summary[methods[0]][fam]['problems']})"]
                + [f"{_f(ev.lofo_summary[n][fam]['top1_geomean'])} / "
                   f"{_f(ev.lofo_summary[n][fam]['top1_p10'])}" for n in methods] for fam in fams]
        out += _table(["held-out family"] + methods, rows) + [""]

    if ev.fallback:
        out += ["## cuBLAS fallback", "",
                "Predicted mode runs cuBLAS unless the fallback model's q-quantile of "
                "log(t_top1 / t_cuBLAS) is below 0. Judged on held-out problems (K-fold over "
                "problems on out-of-fold picks). Speedups are geomeans of time ratios.", ""]
        rows = [[f"{o.quantile:g}" + (" (shipped)" if o.quantile == ev.fallback_quantile else ""),
                 _pct(o.fallback_rate), _pct(o.coverage), _f(o.speedup_vs_cublas),
                 _f(o.speedup_vs_top1), _f(o.top1_vs_cublas), _f(o.oracle_vs_cublas),
                 _pct(o.regressed), str(o.problems)] for o in ev.fallback]
        out += _table(["quantile", "falls back", "truth <= predicted quantile",
                       "vs always-cuBLAS", "vs always-top-1", "always-top-1 vs cuBLAS",
                       "per-problem oracle vs cuBLAS",
                       f"> {REGRESSION:.0%} slower than cuBLAS", "problems"], rows) + [""]

    out += ["## Plots", ""] + ([f"![{p}]({p})" for p in plots] or [note]) + [""]
    return "\n".join(out)


def _save(fig, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_atomic(path, buf.getvalue(), "report plot")


def _plots(ev: Evaluation, folder: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = _order(ev)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n in names:
        e = np.sort(ev.cv[n].problems.eff[1])
        ax.plot(e, np.arange(1, len(e) + 1) / len(e), label=n, lw=2 if n == ev.chosen else 1)
    ax.set(xlabel="top-1 oracle efficiency (t_best / t_top1)", ylabel="fraction of problems <= x",
           title="Held-out top-1 efficiency (CV)", xlim=(max(0.0, ax.get_xlim()[0]), 1.0))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, folder / "top1_cdf.png")
    plt.close(fig)

    buckets = [b for b in (bucket_name(lo, hi) for lo, hi in M_BUCKETS)
               if b in ev.cv_summary[ev.chosen]]
    fig, ax = plt.subplots(figsize=(8, 5))
    width = 0.8 / len(names)
    for i, n in enumerate(names):
        ax.bar(np.arange(len(buckets)) + i * width,
               [ev.cv_summary[n][b]["top1_geomean"] for b in buckets], width, label=n)
    ax.set_xticks(np.arange(len(buckets)) + 0.4 - width / 2, buckets)
    ax.set(ylabel="top-1 geomean efficiency", title="Held-out top-1 by M bucket (CV)",
           ylim=(0.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    fig.tight_layout()
    _save(fig, folder / "m_buckets.png")
    plt.close(fig)
    return ["top1_cdf.png", "m_buckets.png"]


def metrics_json(ev: Evaluation, metadata: dict) -> dict:
    return {"arch": ev.arch, "dtype": ev.dtype, "device": ev.device, "chosen": ev.chosen,
            "problems": ev.problems, "rows": ev.rows, "failed_rows": ev.failed_rows,
            "families": ev.families, "swept": int(ev.swept.sum()), "trained_on": metadata.get("trained_on", {}),
            "packages": metadata.get("packages", {}), "cv": ev.cv_summary,
            "coverage": {n: float(np.mean(h.coverage)) for n, h in ev.cv.items()
                         if h.coverage is not None},
            "leave_family_out": ev.lofo_summary,
            "fallback": [o.__dict__ for o in ev.fallback],
            "fallback_quantile": ev.fallback_quantile}


def _json_safe(x):
    """nan -> null, so metrics.json is strict JSON."""
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return None if math.isnan(x) else float(x)
    if isinstance(x, np.integer):
        return int(x)
    return x


def write_report(ev: Evaluation, folder: Path, metadata: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    try:
        plots, note = _plots(ev, folder), ""
    except ImportError:
        plots, note = [], "(matplotlib is not installed: no plots)"
    write_atomic(folder / "metrics.json", json.dumps(_json_safe(metrics_json(ev, metadata)),
                 indent=1, sort_keys=True, allow_nan=False), "report file")
    return write_atomic(folder / "report.md", markdown(ev, metadata, plots, note), "report file")
