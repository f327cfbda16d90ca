"""The evaluation report of `cutetune train`: report.md, metrics.json and PNG plots.

metrics.json holds every number the markdown shows, so a figure quoted elsewhere can cite it.
Plots need matplotlib; without it the report says so and keeps the tables. The report is the
same for both kinds of model (``kinds``), in the kind's words: its ATen baseline (cuBLAS, or
torch._grouped_mm), its size buckets, and its targets (``TARGETS``; a grouped model's are issue
#33's, section 5). metrics.json keeps the dense names of the baseline's metrics ("cublas")
for both kinds; its "baseline" says which one they compare with.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np

from ..artifacts import write_atomic
from .evaluate import NDCG_K, bucket_name
from .fallback import REGRESSION
from .kinds import KINDS, ProblemKind
from .train import RANKER_MARGIN, Evaluation

# Held-out (CV) floors of the shipped model, per kind: metric -> floor. A grouped model also
# has to beat the best fixed config and, in predicted mode, torch._grouped_mm
# (GROUPED_MODE_TARGETS: the fallback's outcome at the shipped quantile).
TARGETS = {"dense": {"top1_geomean": 0.97, "top1_p10": 0.92, "top5_geomean": 0.99},
           "grouped": {"top1_geomean": 0.97, "top1_p10": 0.92}}
LAYOUT_TARGETS = {"top1_geomean": 0.97, "top1_p10": 0.92}  # each layout's (issue #35)
GROUPED_MODE_TARGETS = {"speedup_vs_cublas": 1.15, "worst_vs_cublas": 0.98}
LOFO_TEXT = {"dense": ("Leave-one-family-out", "Each family (suite) is"),
             "grouped": ("Leave-one-model-out", "Each MoE model's expert GEMMs (a family; "
                         "moe_random: the random problems) are")}
# Baselines a kind's report names without comparing, and why.
NOT_COMPARED = {"grouped": (
    "nvMatmulHeuristics is not among the baselines: it describes a problem by M, N, K, batch "
    "and layout, with no ragged dimension to ask it about; its answer for a stand-in batched "
    "GEMM would not be its answer for a grouped one. quack's autotune list is left out too: "
    "it is mapped onto the dense space only.")}


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


def _kind(ev: Evaluation) -> ProblemKind:
    return KINDS[ev.kind]


def _buckets(ev: Evaluation) -> list[str]:
    kind = _kind(ev)
    return [b for b in (bucket_name(lo, hi, kind.bucket_label) for lo, hi in kind.buckets)
            if b in ev.cv_summary[ev.chosen]]


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
                   "top-10 geomean", "Kendall tau", f"NDCG@{NDCG_K}",
                   f"top-1 vs {_kind(ev).baseline}", f"top-1 beats {_kind(ev).baseline}",
                   "own pick measured"], rows)


def targets(ev: Evaluation) -> list[dict]:
    """Each target of the model's kind: what, value, goal, met (held-out numbers)."""
    s = ev.cv_summary[ev.chosen]["all"]
    out = [{"what": k, "value": s[k], "goal": v, "met": bool(s[k] >= v)}
           for k, v in TARGETS[ev.kind].items()]
    out += [{"what": f"{k} ({layout})", "value": x[k], "goal": v, "met": bool(x[k] >= v)}
            for layout, x in ev.by_layout.get(ev.chosen, {}).items()
            for k, v in LAYOUT_TARGETS.items()]
    if ev.kind != "grouped":
        return out
    if "best_fixed" in ev.cv_summary:
        fixed = ev.cv_summary["best_fixed"]["all"]["top1_geomean"]
        out.append({"what": "top1_geomean over best_fixed's", "value": s["top1_geomean"] / fixed,
                    "goal": 1.0, "met": bool(s["top1_geomean"] > fixed)})
    shipped = [o for o in ev.fallback if o.quantile == ev.fallback_quantile]
    for k, v in GROUPED_MODE_TARGETS.items() if shipped else ():
        x = getattr(shipped[0], k)
        out.append({"what": f"predicted mode {k}", "value": x, "goal": v, "met": bool(x >= v)})
    return out


def _extra_line(extra: dict | None) -> list[str]:
    """The report's line on another dtype's data that joined every fit (``train``'s extra)."""
    if not extra:
        return []
    return [f"Joined every fit of the learned models, never scored: "
            f"`{extra.get('dataset', '?')}` (sha256 `{str(extra.get('sha256', '?'))[:16]}…`), "
            f"{extra['problems']} problems in {', '.join(extra['dtypes'])}, {extra['rows']} rows; "
            f"a held-out fold's fits leave out its problems' layers (their sizes in any order), "
            f"a held-out family's fits that family. The baselines fit on this dataset alone."]


def markdown(ev: Evaluation, metadata: dict, plots: list[str], note: str) -> str:
    data = metadata.get("trained_on", {})
    kind, base = _kind(ev), _kind(ev).baseline
    what = "" if ev.kind == "dense" else f"{ev.kind} GEMMs, "
    out = [f"# Cost model evaluation: {what}{ev.arch} {ev.dtype} on {ev.device}", "",
           f"Dataset: `{data.get('dataset', '?')}` (sha256 `{str(data.get('sha256', '?'))[:16]}…`): "
           f"{ev.problems} problems ({int(ev.swept.sum())} fully swept), {ev.rows} ok quack rows "
           f"({ev.failed_rows} failed rows left out), families: " + ", ".join(f"{k} ({v})" for k, v in ev.families.items()) + ".",
           *_extra_line(data.get("extra")),
           f"Shipped model: **{ev.chosen}** (regression unless a ranking objective beats its "
           f"held-out top-1 geomean by more than {RANKER_MARGIN}). Packages: " + ", ".join(f"{k} {v}" for k, v in
                                                 metadata.get("packages", {}).items()) + ".", "",
           "Oracle efficiency = t_best / t_chosen per problem, t_best the fastest measured ok "
           "config of the problem (the candidates are the measured configs). top-k = best "
           f"measured time among the k first picks. vs {base} = t_{base} / t_top1 (> 1: faster "
           f"than {base}). All numbers are on problems the model did not train on.", ""]

    checks = [f"{t['what']} {_f(t['value'])} {'>=' if t['value'] >= t['goal'] else '<'} "
              f"{t['goal']} ({'met' if t['met'] else 'NOT met'})" for t in targets(ev)]
    out += ["Targets: " + "; ".join(checks) + ".", ""]

    out += [f"## Problem-grouped {metadata.get('cv_folds', '?')}-fold cross-validation", ""]
    out += _method_table(ev, "all")
    out += ["", "Methods: " + "; ".join(f"**{n}**: {ev.cv[n].method.description}"
                                         for n in _order(ev)) + ".",
            "", "*own pick measured*: share of problems whose heuristic pick "
            + ("(quack_autotune: its whole list) " if "quack_autotune" in ev.cv else "")
            + "was among the measured configs; elsewhere the nearest measured config stood in "
            "for it, so the heuristic rows are exact only on fully swept problems.", ""]
    if ev.kind in NOT_COMPARED:
        out += [NOT_COMPARED[ev.kind], ""]
    if "swept" in ev.cv_summary[ev.chosen]:
        out += [f"### Fully swept problems ({int(ev.swept.sum())}: every valid config measured)", "",
                "Here t_best is the best of the whole valid space and every heuristic's pick was "
                "measured exactly.", ""] + _method_table(ev, "swept") + [""]

    out += [f"### By {kind.bucket_label} bucket (top-1 geomean / P10 / best-of-top-5 geomean)", ""]
    present = _buckets(ev)
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

    if ev.by_layout:
        layouts = list(ev.by_layout[ev.chosen])
        out += ["### By layout (top-1 geomean / P10)", "",
                "A's and B's majors: kk is nn.Linear's forward, kn its input gradient, mn its "
                "weight gradient; bmm a batched problem.", ""]
        rows = [[n] + [f"{_f(ev.by_layout[n][k]['top1_geomean'])} / "
                       f"{_f(ev.by_layout[n][k]['top1_p10'])}" for k in layouts]
                for n in _order(ev)]
        counts = [f"{k} ({ev.by_layout[ev.chosen][k]['problems']})" for k in layouts]
        out += _table(["method"] + counts, rows) + [""]

    if ev.lofo_summary:
        title, held = LOFO_TEXT[ev.kind]
        out += [f"## {title} (top-1 geomean / P10)", "",
                f"{held} held out whole: the learned models train on the others.", ""]
        methods = [n for n in _order(ev) if n in ev.lofo_summary]
        fams = list(next(iter(ev.lofo_summary.values())))
        rows = [[f"{fam} ({ev.lofo_summary[methods[0]][fam]['problems']})"]
                + [f"{_f(ev.lofo_summary[n][fam]['top1_geomean'])} / "
                   f"{_f(ev.lofo_summary[n][fam]['top1_p10'])}" for n in methods] for fam in fams]
        out += _table(["held-out family"] + methods, rows) + [""]

    if ev.fallback:
        rule = (f"the fallback model's q-quantile of log(t_top1 / t_{base}) is below 0"
                if ev.fallback_objective == "quantile" else
                f"the fallback classifier's P(t_top1 < t_{base}) exceeds q")
        out += [f"## {base} fallback", "",
                f"Predicted mode runs {base} unless {rule}. Judged on held-out problems (K-fold "
                "over problems on out-of-fold picks). Speedups are geomeans of time ratios; "
                f"worst is the least t_{base} / t_chosen over the problems.", ""]
        cells = lambda o: [_pct(o.fallback_rate), _f(o.speedup_vs_cublas),  # noqa: E731
                           _f(o.worst_vs_cublas), _f(o.speedup_vs_top1), _f(o.top1_vs_cublas),
                           _f(o.oracle_vs_cublas), _pct(o.regressed), str(o.problems)]
        head = ["falls back", f"predicted mode vs {base}", "worst problem", "vs always-top-1",
                f"always-top-1 vs {base}", f"per-problem oracle vs {base}",
                f"> {REGRESSION:.0%} slower than {base}", "problems"]
        rows = [[f"{o.quantile:g}" + (" (shipped)" if o.quantile == ev.fallback_quantile else ""),
                 _pct(o.coverage)] + cells(o) for o in ev.fallback]
        out += _table(["quantile", "truth <= predicted quantile"] + head, rows) + [""]
        if ev.fallback_by_bucket:
            out += [f"### Predicted mode by {kind.bucket_label} bucket (shipped quantile "
                    f"{ev.fallback_quantile:g})", ""]
            out += _table([kind.bucket_label] + head, [[b] + cells(o) for b, o in
                                                       ev.fallback_by_bucket.items()]) + [""]

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

    buckets = _buckets(ev)
    fig, ax = plt.subplots(figsize=(8, 5))
    width = 0.8 / len(names)
    for i, n in enumerate(names):
        ax.bar(np.arange(len(buckets)) + i * width,
               [ev.cv_summary[n][b]["top1_geomean"] for b in buckets], width, label=n)
    ax.set_xticks(np.arange(len(buckets)) + 0.4 - width / 2, buckets)
    ax.set(ylabel="top-1 geomean efficiency",
           title=f"Held-out top-1 by {_kind(ev).bucket_label} bucket (CV)",
           ylim=(0.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    fig.tight_layout()
    _save(fig, folder / "m_buckets.png")
    plt.close(fig)
    return ["top1_cdf.png", "m_buckets.png"]


def metrics_json(ev: Evaluation, metadata: dict) -> dict:
    kind = _kind(ev)
    return {"kind": ev.kind, "baseline": {"name": kind.baseline, "backend": kind.baseline_backend},
            "arch": ev.arch, "dtype": ev.dtype, "device": ev.device, "chosen": ev.chosen,
            "problems": ev.problems, "rows": ev.rows, "failed_rows": ev.failed_rows,
            "families": ev.families, "swept": int(ev.swept.sum()), "trained_on": metadata.get("trained_on", {}),
            "packages": metadata.get("packages", {}), "cv": ev.cv_summary,
            "coverage": {n: float(np.mean(h.coverage)) for n, h in ev.cv.items()
                         if h.coverage is not None},
            "leave_family_out": ev.lofo_summary, "by_layout": ev.by_layout,
            "fallback": [o.__dict__ for o in ev.fallback],
            "fallback_quantile": ev.fallback_quantile,
            "fallback_objective": ev.fallback_objective,
            "fallback_by_bucket": {b: o.__dict__ for b, o in ev.fallback_by_bucket.items()},
            "targets": targets(ev)}


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
