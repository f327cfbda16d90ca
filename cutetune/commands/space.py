"""`cutetune space show|count|check`: look at the search space and let the compiler judge it."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from .. import progress
from ..artifacts import check_writable, write_artifact
from ..space.config import KernelConfig
from ..space.enumerate import axes, check_arch, compile_keys, enumerate_configs, grid
from ..space.problem import (ARCHES, GROUPED_GEMMS, SUPPORTED_DTYPES, GemmProblem,
                             GroupedProblem, grouped_family)
from ..space.rules import Rule, family_rules, violations
from .options import at_least, more_than

ARCH_HELP = f"target architecture: {' or '.join(ARCHES)}"
GEMM_HELP = (f"a grouped (MoE expert) GEMM: {', '.join(GROUPED_GEMMS)} (varlen M: the forward "
             "and the input gradient; varlen K: the weight gradient)")


def _arches(arch: str | None) -> list[str]:
    return [check_arch(arch)] if arch else list(ARCHES)


def _family(args) -> str:
    """The config family --gemm selects (dense without it)."""
    return "dense" if args.gemm is None else grouped_family(args.gemm)


def _problem(args) -> GemmProblem | GroupedProblem | None:
    """The problem named by --m/--n/--k (None when none of them is given): dense, or with
    --gemm grouped (and --experts then required)."""
    sizes = {"--m": args.m, "--n": args.n, "--k": args.k}
    if args.experts is not None and args.gemm is None:
        raise ValueError("--experts is for a grouped problem: add --gemm "
                         + "|".join(GROUPED_GEMMS))
    if all(v is None for v in sizes.values()):
        return None
    missing = [name for name, v in sizes.items() if v is None]
    if args.gemm is not None and args.experts is None:
        missing.append("--experts")
    if missing:
        need = "--experts, --m, --n and --k" if args.gemm else "--m, --n and --k"
        raise ValueError(f"a problem needs {need}; missing {', '.join(missing)}")
    if args.gemm is not None:
        dense_only = [f"--{n.replace('_', '-')}" for n in ("batch", "a_major", "b_major")
                      if getattr(args, n) is not None]
        if dense_only:
            raise ValueError(f"{', '.join(dense_only)}: for dense problems only (a grouped "
                             "GEMM's majors follow from --gemm)")
        return GroupedProblem(args.experts, args.m, args.n, args.k, gemm=args.gemm,
                              dtype=args.dtype, out_dtype=args.dtype, arch=args.arch)
    default = lambda v, d: d if v is None else v  # noqa: E731
    return GemmProblem(args.m, args.n, args.k, batch=default(args.batch, 1), dtype=args.dtype,
                       out_dtype=args.dtype, a_major=default(args.a_major, "k"),
                       b_major=default(args.b_major, "k"), arch=args.arch)


def _rule_dict(r: Rule) -> dict:
    return {"name": r.name, "arches": list(r.arches),
            "scope": "problem" if r.needs_problem else "config", "why": r.why}


def _config_row(c: KernelConfig) -> dict:
    return {"config_key": c.short(), **c.to_dict()}


def _print(obj) -> None:
    print(json.dumps(obj, indent=2))


def _table(rows: list[dict], columns: list[str]) -> str:
    cells = [[str(r[c]) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


# ---------------------------------------------------------------- show
def cmd_show(args) -> int:
    arch = check_arch(args.arch)
    family = _family(args)
    problem = _problem(args)
    rules = family_rules(family, arch)
    out: dict = {"arch": arch, "family": family,
                 "axes": {k: list(v) for k, v in axes(arch, family).items()},
                 "rules": [_rule_dict(r) for r in rules]}
    if problem is not None:
        configs = enumerate_configs(arch, problem)
        shown = configs[: args.limit] if args.limit else configs
        out["problem"] = problem.to_dict()
        out["valid_configs"] = len(configs)
        out["configs"] = [_config_row(c) for c in shown]
    if args.json:
        _print(out)
        return 0
    title = "" if family == "dense" else f", grouped GEMM {args.gemm} ({family})"
    print(f"arch {arch}{title}\n\naxes (before the rules filter):")
    for name, values in out["axes"].items():
        print(f"  {name:22s} {', '.join(str(v) for v in values)}")
    print("\nrules (a config must satisfy all):")
    for r in rules:
        scope = " [problem]" if r.needs_problem else ""
        print(f"  {r.name}{scope}: {r.why}")
    if problem is not None:
        print(f"\n{len(configs)} valid configs for {problem.key()}"
              + (f" (first {len(shown)})" if len(shown) < len(configs) else "") + ":")
        if shown:
            print(_table(out["configs"], list(out["configs"][0])))
    return 0


# ---------------------------------------------------------------- count
def family_counts(arch: str, family: str = "dense",
                  problem: GroupedProblem | None = None) -> dict:
    """Grid size, valid configs, distinct compiled kernels, and per rule how many grid points
    it rejects (in all, and as the only rule broken), of one config family: its config rules,
    and with ``problem`` its problem rules too."""
    points = list(grid(arch, family))
    valid = enumerate_configs(arch, problem, family)
    any_, alone = Counter(), Counter()
    for c in points:
        broken = [r.name for r in violations(c, arch, problem, family)]
        any_.update(broken)
        if len(broken) == 1:
            alone[broken[0]] += 1
    rules = family_rules(family, arch, problem=None if problem is not None else False)
    return {"grid_points": len(points), "valid_configs": len(valid),
            "valid_kernels": len(compile_keys(valid)),
            "rules": {r.name: {"rejects": any_[r.name], "rejects_alone": alone[r.name]}
                      for r in rules}}


def space_counts(arch: str) -> dict:
    """``family_counts`` of the dense family, and under "grouped" those of each grouped GEMM
    (its family, with the problem rules of its layout: the check's problem)."""
    from ..tuner.measure.space_check import check_problem  # no compiler behind it

    return {"arch": arch, **family_counts(arch),
            "grouped": {g: family_counts(arch, grouped_family(g), check_problem(arch, g))
                        for g in GROUPED_GEMMS}}


def _print_counts(name: str, c: dict) -> None:
    print(f"{name}: {c['valid_configs']} valid configs, {c['valid_kernels']} distinct "
          f"compiled kernels, of {c['grid_points']} grid points")
    print(_table([{"rule": k, **v} for k, v in c["rules"].items()],
                 ["rule", "rejects", "rejects_alone"]))


def cmd_count(args) -> int:
    counts = [space_counts(a) for a in _arches(args.arch)]
    if args.json:
        _print(counts if args.arch is None else counts[0])
        return 0
    for c in counts:
        _print_counts(c["arch"], c)
        for gemm, g in c["grouped"].items():
            _print_counts(f"{c['arch']} grouped {gemm} ({grouped_family(gemm)})", g)
    return 0


# ---------------------------------------------------------------- check
def cmd_check(args) -> int:
    arch = check_arch(args.arch)
    out = Path(args.out) if args.out else None
    if out is not None:
        if not out.parent.is_dir():
            raise FileNotFoundError(f"--out folder {out.parent} does not exist")
        check_writable(out, "--out report")  # now, not after an hour of compiles
    from ..tuner.measure.space_check import run_check  # compiles: needs quack, not a GPU

    bar = progress.bar(None, "compile", unit="kernel", quiet=args.quiet)
    failed = 0

    def show(done: int, total: int, r) -> None:
        """On a terminal the bar, with each failure written above it; elsewhere (logs) one
        line per compiled config, as a record of each verdict: a compile takes seconds, so
        that is no flood."""
        nonlocal failed
        if args.quiet:
            return
        msg = f"{r.status} {r.seconds:6.2f}s" + (f"  {r.error[:160]}" if r.error else "")
        line = f"[{done}] {r.config.short()}: {msg}"
        if bar.disable:
            print(line, file=sys.stderr, flush=True)
            return
        failed += not r.ok
        if not r.ok:
            bar.write(line, file=sys.stderr)
        bar.total = total
        bar.set_postfix_str(f"{failed} failed", refresh=False)
        bar.update()

    gemm = args.gemm
    with bar:
        report = run_check(arch, sample=args.sample, seed=args.seed, workers=args.workers,
                           rejected=args.rejected, cache_dir=args.cache_dir,
                           timeout_s=args.timeout, on_result=show, gemm=gemm)
    s = report["summary"]
    if args.json:
        _print({k: report[k] for k in report if k != "results"})
    else:
        what = arch if gemm is None else f"{arch} grouped {gemm}"
        print(f"{what}: compiled {s['count']} of {report['valid_kernels']} valid kernels for "
              f"{report['dsl_arch']}: {s['ok']} ok, {s['failed']} failed; "
              f"{s['configs_per_minute']} configs/min with {report['workers']} workers")
        if s["ok"]:
            print(f"compile seconds: p50 {s['compile_s_p50']}  p90 {s['compile_s_p90']}  "
                  f"max {s['compile_s_max']} (CPU p50 {s['cpu_s_p50']}); all "
                  f"{report['valid_kernels']} kernels on 16 cores: "
                  f"~{s['projected_minutes_all_kernels_16_cores']} min")
        for f in report["failures"]:
            print(f"FAILED {f['config_key']} ({f['status']}): {f.get('error', '')[:300]}")
        if "rejected" in report:
            rej = report["rejected"]
            print(f"\nrule-rejected grid points: {rej['compiler_rejects']} of {rej['tried']} "
                  f"also rejected by the compiler")
            print(_table([{"rule": k, **v} for k, v in rej["rules"].items()],
                         ["rule", "tried_alone", "compiler_rejects_alone", "verdict"]))
    if out is not None:  # last: what is printed above stays if the disk is full
        write_artifact(out, json.dumps(report, indent=1) + "\n", "--out report")
        if not args.json:
            print(f"report written to {out}")
    return 1 if s["failed"] else 0


# ---------------------------------------------------------------- parser
def _add_problem_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("problem (optional; --m, --n and --k together, and --experts "
                             "with --gemm)")
    g.add_argument("--m", type=int, help="rows of A and D (of all experts: M_total, for a "
                   "grouped fwd or dgrad)")
    g.add_argument("--n", type=int, help="columns of B and D")
    g.add_argument("--k", type=int, help="the reduction dimension (of all experts: the routed "
                   "rows, for a grouped wgrad)")
    g.add_argument("--batch", type=int, help="batch count (default 1; dense only)")
    g.add_argument("--experts", type=int, help="experts of a grouped problem (with --gemm)")
    g.add_argument("--dtype", default="bf16",
                   help=f"A/B/D element type: {', '.join(SUPPORTED_DTYPES)} (default bf16)")
    g.add_argument("--a-major",
                   help="contiguous dim of A (M, K): k (row-major, default) or m; dense only")
    g.add_argument("--b-major",
                   help="contiguous dim of B (K, N): k (nn.Linear weight, default) or n; "
                   "dense only")


def register(subparsers) -> None:
    space = subparsers.add_parser(
        "space", help="inspect the kernel search space and compile-check its rules",
        description="The search space of quack GEMM kernel configs: its axes, the validity "
        "rules that filter them, counts, and a GPU-free compile check of the rules.")
    sub = space.add_subparsers(dest="space_command", metavar="SUBCOMMAND", required=True)

    show = sub.add_parser(
        "show", help="axes, rules, and the valid configs for a problem",
        description="Print the arch's axes and validity rules (with the reason for each), of "
        "dense GEMMs or with --gemm of a grouped one; given --m --n --k (and --experts), also "
        "the valid configs for that problem.")
    show.add_argument("--arch", default="sm90", help=ARCH_HELP + " (default sm90)")
    show.add_argument("--gemm", help=GEMM_HELP + "; default: a dense GEMM")
    _add_problem_args(show)
    show.add_argument("--limit", action=at_least(0), default=20, metavar="N",
                      help="list at most N configs (default 20, 0 for all; the count is exact)")
    show.add_argument("--json", action="store_true", help="print JSON instead of text")
    show.set_defaults(func=cmd_show)

    count = sub.add_parser(
        "count", help="valid configs, compiled kernels and per-rule rejections",
        description="Count the grid points, valid configs and distinct compiled kernels "
        "(configs that differ only in run-time knobs share a kernel) per arch, and how many "
        "grid points each rule rejects: of dense GEMMs, then of grouped ones (varlen M and "
        "varlen K).")
    count.add_argument("--arch", help=ARCH_HELP + " (default: both)")
    count.add_argument("--json", action="store_true", help="print JSON instead of text")
    count.set_defaults(func=cmd_count)

    check = sub.add_parser(
        "check", help="compile sampled configs on the CPU (no GPU) to check the rules",
        description="Compile valid kernels with CuteDSL for sm_90a/sm_100a in GPU-blind "
        "worker processes and report compile seconds and failures; optionally also compile "
        "grid points the rules reject, to see per rule whether the compiler agrees. Exits 1 "
        "when a valid config fails to compile.")
    check.add_argument("--arch", default="sm90", help=ARCH_HELP + " (default sm90)")
    check.add_argument("--gemm", help=GEMM_HELP + "; its kernels are checked instead of the "
                       "dense ones")
    check.add_argument("--sample", action=at_least(1), metavar="N",
                       help="compile this many distinct valid kernels (default: all of them)")
    check.add_argument("--seed", type=int, default=0, metavar="S", help="sampling seed (default 0)")
    check.add_argument("--workers", action=at_least(1), default=2, metavar="W",
                       help="compile processes (default 2; one per core is right)")
    check.add_argument("--rejected", action=at_least(0), default=0, metavar="R",
                       help="also compile R grid points the rules reject (default 0)")
    check.add_argument("--cache-dir", metavar="DIR",
                       help="quack kernel cache to fill (default: a fresh temporary one, so "
                       "every kernel is compiled from scratch)")
    check.add_argument("--timeout", action=more_than(0), default=300.0, metavar="SECONDS",
                       help="seconds before one compile counts as hung (default 300)")
    check.add_argument("--out", metavar="FILE",
                       help="write the full JSON report to this file (gzipped if it ends in .gz)")
    check.add_argument("--quiet", action="store_true", help="no per-config progress on stderr")
    check.add_argument("--json", action="store_true",
                       help="print the report (less per-config results) as JSON")
    check.set_defaults(func=cmd_check)
