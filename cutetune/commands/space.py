"""`cutetune space show|count|check`: look at the search space and let the compiler judge it."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from ..space.config import KernelConfig
from ..space.enumerate import AXES, check_arch, compile_keys, enumerate_configs, grid
from ..space.problem import ARCHES, SUPPORTED_DTYPES, GemmProblem
from ..space.rules import CONFIG_RULES, PROBLEM_RULES, Rule, violations
from ..cli import at_least, more_than

ARCH_HELP = f"target architecture: {' or '.join(ARCHES)}"


def _arches(arch: str | None) -> list[str]:
    return [check_arch(arch)] if arch else list(ARCHES)


def _problem(args) -> GemmProblem | None:
    """The problem named by --m/--n/--k (None when none of them is given)."""
    sizes = {"--m": args.m, "--n": args.n, "--k": args.k}
    if all(v is None for v in sizes.values()):
        return None
    missing = [name for name, v in sizes.items() if v is None]
    if missing:
        raise ValueError(f"a problem needs --m, --n and --k; missing {', '.join(missing)}")
    return GemmProblem(args.m, args.n, args.k, batch=args.batch, dtype=args.dtype,
                       out_dtype=args.dtype, a_major=args.a_major, b_major=args.b_major,
                       arch=args.arch)


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
    problem = _problem(args)
    rules = [r for r in CONFIG_RULES + PROBLEM_RULES if arch in r.arches]
    out: dict = {"arch": arch, "axes": {k: list(v) for k, v in AXES[arch].items()},
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
    print(f"arch {arch}\n\naxes (before the rules filter):")
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
def space_counts(arch: str) -> dict:
    """Grid size, valid configs, distinct compiled kernels, and per config rule how many grid
    points it rejects (in all, and as the only rule broken)."""
    points = list(grid(arch))
    valid = enumerate_configs(arch)
    any_, alone = Counter(), Counter()
    for c in points:
        broken = [r.name for r in violations(c, arch)]
        any_.update(broken)
        if len(broken) == 1:
            alone[broken[0]] += 1
    return {"arch": arch, "grid_points": len(points), "valid_configs": len(valid),
            "valid_kernels": len(compile_keys(valid)),
            "rules": {r.name: {"rejects": any_[r.name], "rejects_alone": alone[r.name]}
                      for r in CONFIG_RULES if arch in r.arches}}


def cmd_count(args) -> int:
    counts = [space_counts(a) for a in _arches(args.arch)]
    if args.json:
        _print(counts if args.arch is None else counts[0])
        return 0
    for c in counts:
        print(f"{c['arch']}: {c['valid_configs']} valid configs, {c['valid_kernels']} distinct "
              f"compiled kernels, of {c['grid_points']} grid points")
        print(_table([{"rule": k, **v} for k, v in c["rules"].items()],
                     ["rule", "rejects", "rejects_alone"]))
    return 0


# ---------------------------------------------------------------- check
def cmd_check(args) -> int:
    arch = check_arch(args.arch)
    out = Path(args.out) if args.out else None
    if out is not None and not out.parent.is_dir():
        raise FileNotFoundError(f"--out folder {out.parent} does not exist")
    from ..tuner.measure.space_check import run_check  # compiles: needs quack, not a GPU

    def progress(done: int, r) -> None:
        if not args.quiet:
            msg = f"{r.status} {r.seconds:6.2f}s" + (f"  {r.error[:160]}" if r.error else "")
            print(f"[{done}] {r.config.short()}: {msg}", file=sys.stderr, flush=True)

    report = run_check(arch, sample=args.sample, seed=args.seed, workers=args.workers,
                       rejected=args.rejected, cache_dir=args.cache_dir,
                       timeout_s=args.timeout, on_result=progress)
    if out is not None:
        tmp = out.with_suffix(out.suffix + ".tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        tmp.replace(out)
    s = report["summary"]
    if args.json:
        _print({k: report[k] for k in report if k != "results"})
    else:
        print(f"{arch}: compiled {s['count']} of {report['valid_kernels']} valid kernels for "
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
        if out is not None:
            print(f"report written to {out}")
    return 1 if s["failed"] else 0


# ---------------------------------------------------------------- parser
def _add_problem_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("problem (optional; --m, --n and --k together)")
    g.add_argument("--m", type=int, help="rows of A and D")
    g.add_argument("--n", type=int, help="columns of B and D")
    g.add_argument("--k", type=int, help="the reduction dimension")
    g.add_argument("--batch", type=int, default=1, help="batch count (default 1)")
    g.add_argument("--dtype", default="bf16",
                   help=f"A/B/D element type: {', '.join(SUPPORTED_DTYPES)} (default bf16)")
    g.add_argument("--a-major", default="k",
                   help="contiguous dim of A (M, K): k (row-major, default) or m")
    g.add_argument("--b-major", default="k",
                   help="contiguous dim of B (K, N): k (nn.Linear weight, default) or n")


def register(subparsers) -> None:
    space = subparsers.add_parser(
        "space", help="inspect the kernel search space and compile-check its rules",
        description="The search space of quack GEMM kernel configs: its axes, the validity "
        "rules that filter them, counts, and a GPU-free compile check of the rules.")
    sub = space.add_subparsers(dest="space_command", metavar="SUBCOMMAND", required=True)

    show = sub.add_parser(
        "show", help="axes, rules, and the valid configs for a problem",
        description="Print the arch's axes and validity rules (with the reason for each); "
        "given --m --n --k, also the valid configs for that problem.")
    show.add_argument("--arch", default="sm90", help=ARCH_HELP + " (default sm90)")
    _add_problem_args(show)
    show.add_argument("--limit", action=at_least(0), default=20, metavar="N",
                      help="list at most N configs (default 20, 0 for all; the count is exact)")
    show.add_argument("--json", action="store_true", help="print JSON instead of text")
    show.set_defaults(func=cmd_show)

    count = sub.add_parser(
        "count", help="valid configs, compiled kernels and per-rule rejections",
        description="Count the grid points, valid configs and distinct compiled kernels "
        "(configs that differ only in run-time knobs share a kernel) per arch, and how many "
        "grid points each rule rejects.")
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
    check.add_argument("--out", metavar="FILE", help="write the full JSON report to this file")
    check.add_argument("--quiet", action="store_true", help="no per-config progress on stderr")
    check.add_argument("--json", action="store_true",
                       help="print the report (less per-config results) as JSON")
    check.set_defaults(func=cmd_check)
