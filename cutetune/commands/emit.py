"""`cutetune emit`: freeze a trained cost model, with the measured tables beside it, into the
compile-time heuristics file (``models/heuristics.py``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from .. import progress
from ..artifacts import check_writable
from ..errors import UserError
from ..models.heuristics import (EXACT_MARGIN, FILE_TOP_K, Grid, Pick, _digest, build,
                                 measured_picks, predicted_triton_shapes)
from ..models.triton_mm import TritonTable
from ..space.config import KernelConfig
from ..space.problem import ARCHES, SUPPORTED_DTYPES, GemmProblem
from .options import at_least


# ---------------------------------------------------------------- `cutetune emit`
def _recorded(dataset: str, arch: str, dtype: str, top_k: int, margin: float
              ) -> tuple[list[GemmProblem], dict[str, Pick]]:
    """The dataset's problems on (arch, dtype) and their measured picks."""
    from ..models.dataset import CONFIG_COLUMNS, PROBLEM_COLUMNS, load, problem_of

    columns = [*PROBLEM_COLUMNS, "problem_key", "backend", "status", "time_ms", *CONFIG_COLUMNS]
    rows = [r for r in load(dataset, columns=columns).to_pylist()
            if (r["arch"], r["dtype"]) == (arch, dtype)]
    problems = {r["problem_key"]: problem_of(r) for r in rows}
    return [problems[k] for k in sorted(problems)], measured_picks(rows, top_k, margin)


def _read_each(paths, load, what: str) -> list:
    """``load(path)`` (a list) of every path, concatenated; UserError naming the file that
    cannot be read or parsed."""
    out = []
    for path in paths or ():
        try:
            out += load(path)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UserError(f"{what} {path}: {type(e).__name__}: {e}") from None
    return out


def _triton_table(args) -> TritonTable:
    """The Triton table from ``--triton-sweep`` files, with launch costs when
    ``--triton-retimed`` and ``--triton-steps`` files are given."""
    from ..models.triton_mm import (check_step_report, fit_launch_costs, load_retimed, load_sweep,
        step_host_us)

    def step_report(path) -> list[dict]:
        report = json.loads(Path(path).read_text())
        if not isinstance(report, dict) or not isinstance(report.get("parts"), list):
            raise ValueError("not a scripts/step_ab.py --report file (no parts)")
        check_step_report(report)
        return [report]

    swept = _read_each(args.triton_sweep, load_sweep, "Triton sweep")
    shapes = predicted_triton_shapes(swept, args.arch, args.dtype)
    if not shapes:
        raise UserError(f"Triton sweeps {', '.join(args.triton_sweep)} have no host-bound, "
                        f"memory-bound shape on {args.arch}/{args.dtype}")
    if bool(args.triton_retimed) != bool(args.triton_steps):
        raise UserError("launch costs need both --triton-retimed and --triton-steps")
    costs = None
    if args.triton_retimed:
        latest: dict = {}  # problem -> its rows from the last file that retimed it
        for path in args.triton_retimed:
            rows: dict = {}
            for r in _read_each([path], load_retimed, "Triton retime"):
                if (r.problem.arch, r.problem.dtype) == (args.arch, args.dtype):
                    rows.setdefault(r.problem, []).append(r)
            latest.update(rows)
        retimed = [r for rows in latest.values() for r in rows]
        steps = _read_each(args.triton_steps, step_report, "step benchmark")
        try:
            costs = fit_launch_costs(retimed, step_host_us(steps))
        except ValueError as e:
            raise UserError(f"Triton launch costs: {e}") from None
    return TritonTable.from_sweep(shapes, costs)


def _gpu_times(args) -> dict:
    """Per problem on (arch, dtype) of the ``--triton-retimed`` files, its candidates' GPU
    times (``models.gpu_times``); a problem retimed in several files takes the last file's."""
    from ..models.gpu_times import retimed_gpu_times

    return {p: t for p, t in _read_each(args.triton_retimed, retimed_gpu_times, "Triton retime")
            if (p.arch, p.dtype) == (args.arch, args.dtype)}


def _swiglu_table(args) -> dict[str, KernelConfig | None]:
    """``swiglu.measured_fusions`` of the ``--swiglu-bench`` files on (arch, dtype); a problem
    in several files takes the last file's."""
    from ..models.heuristics import measured_fusions

    table: dict[str, KernelConfig | None] = {}
    for fusions in _read_each(args.swiglu_bench, lambda path: [measured_fusions(
            json.loads(Path(path).read_text()), args.arch, args.dtype)], "SwiGLU benchmark"):
        table.update(fusions)
    return table


def _cmd_emit(args) -> int:
    try:
        from ..models import load_model
    except ImportError as e:
        raise UserError(f"the cost models are not available ({e})") from None

    check_writable(args.out, "heuristics file")  # before minutes of freezing the model's picks
    grid = Grid(batch=tuple(args.batches))
    model = load_model(args.model, arch=args.arch, dtype=args.dtype)
    problems, measured = (_recorded(args.dataset, args.arch, args.dtype, args.top_k,
                                    args.exact_margin) if args.dataset else ([], {}))
    triton = _triton_table(args) if args.triton_sweep else None
    swiglu = _swiglu_table(args)
    gpu_times = _gpu_times(args)
    meta = {"model": str(args.model), "model_digest": _digest(Path(args.model).read_bytes())
            if Path(args.model).is_file() else None,
            "dataset": args.dataset, "exact_margin": args.exact_margin,
            "triton_sweep": args.triton_sweep, "triton_retimed": args.triton_retimed,
            "triton_steps": args.triton_steps, "swiglu_bench": args.swiglu_bench,
            "created": time.time()}
    t0 = time.perf_counter()
    with progress.bar(grid.size + len(problems), "emit", unit="entry") as bar:
        h = build(model, args.arch, args.dtype, args.top_k, grid, problems, meta,
                  progress=bar.update, measured=measured, triton=triton, swiglu=swiglu,
                  gpu_times=gpu_times)
    path = h.save(args.out)
    quack = sum(not aten for aten, _ in h.exact.values())
    print(f"wrote {path}: {grid.size} grid cells, {len(h.exact)} recorded problems "
          f"({len(measured)} picked from measurements, {quack} of them CuteDSL), "
          f"{len(h.configs)} distinct configs, {path.stat().st_size / 1024:.0f} KiB, "
          f"digest {h.digest} ({time.perf_counter() - t0:.1f} s)")
    if swiglu:
        print(f"SwiGLU: {len(swiglu)} up projections measured, "
              f"{sum(c is not None for c in swiglu.values())} fused")
    if gpu_times:
        kinds = [t.fastest()[0] for t in gpu_times.values()]
        print(f"GPU times: {len(gpu_times)} problems, fastest on "
              + ", ".join(f"{k} {kinds.count(k)}" for k in ("aten", "triton", "quack")))
    if triton is not None:
        print(f"Triton table: {len(triton.picks)} picks, M buckets "
              f"{sorted({b for _, b, _ in triton.picks})}, "
              + (_launch_costs_line(triton.costs) if triton.costs else
                 "no launch costs: predicted mode keeps such mm on ATen"))
    return 0


def _launch_costs_line(c) -> str:
    problems = {r.problem for r in c.measured}
    picks = {r.problem: r.config for r in c.measured if r.variant == "pick"}
    tuned = sum(c.fastest_config(p) != config for p, config in picks.items())
    return (f"launch costs: host {c.aten_host_us:.1f} us per ATen mm, {c.triton_host_us:.1f} "
            f"per Triton mm, host speeds {c.host_factors[0]:.2f}-{c.host_factors[1]:.2f}x; "
            f"{len(problems)} problems retimed ({len(c.measured)} Triton configs), {tuned} "
            "of them run fastest with a config other than their group's pick")


def _positive_int(text: str) -> int:
    (v,) = _positive_ints(text)
    return v


def _positive_ints(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"expected comma-separated positive integers, got {text!r}") from None
    if any(v <= 0 for v in vals):
        raise ValueError(f"expected positive integers, got {text!r}")
    return vals


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "emit", help="freeze a trained cost model into the compile-time heuristics file",
        description="Write the heuristics file Inductor's lowering reads: the model's top-k "
        "configs and cuBLAS flag per cell of a log-spaced (batch, M, N, K) grid and per "
        "recorded problem.")
    p.add_argument("--model", required=True, help="trained cost model (cutetune train output)")
    p.add_argument("--out", required=True, help="heuristics file to write (JSON)")
    p.add_argument("--arch", default="sm90", choices=ARCHES)
    p.add_argument("--dtype", default="bf16", choices=SUPPORTED_DTYPES)
    p.add_argument("--top-k", type=_positive_int, default=FILE_TOP_K,
                   help=f"configs kept per entry (default {FILE_TOP_K})")
    p.add_argument("--dataset", help="dataset folder: add exact entries for its problems, "
                   "from their measurements where they have a cuBLAS time")
    p.add_argument("--exact-margin", action=at_least(0.0, float), default=EXACT_MARGIN,
                   help="a recorded problem gets CuteDSL only if its best measured config beat "
                   f"cuBLAS by this fraction (default {EXACT_MARGIN})")
    p.add_argument("--triton-sweep", nargs="+", metavar="JSONL",
                   help="Inductor's Triton mm timings (scripts/triton_mm_sweep.py, or "
                   "triton_mm.jsonl in a reduced-mode feedback folder): add the Triton configs "
                   "predicted mode gives host-bound, memory-bound mm")
    p.add_argument("--triton-retimed", nargs="+", metavar="JSONL",
                   help="L2-cold GPU times of ATen and Triton configs "
                   "(scripts/triton_mm_retime.py); a problem retimed in several files takes "
                   "the last file's times. A retimed problem gets its fastest config, and "
                   "under CUDA graphs its fastest candidate (ATen, Triton or quack config)")
    p.add_argument("--triton-steps", nargs="+", metavar="JSON",
                   help="step benchmarks (scripts/step_ab.py --report) whose host times per "
                   "launch, with --triton-retimed, decide which of a graph's mm take their "
                   "Triton configs")
    p.add_argument("--swiglu-bench", nargs="+", metavar="JSON",
                   help="fused SwiGLU GPU times (scripts/swiglu_bench.py): a measured up "
                   "projection fuses with its fastest config where that beat the unfused "
                   "default, and stays unfused where none did")
    p.add_argument("--batches", type=_positive_ints, default=[1],
                   help="grid batch values, comma-separated (default 1: bmm uses the cell of "
                   "its per-batch shape)")
    p.set_defaults(func=_cmd_emit)
