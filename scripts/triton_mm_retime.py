#!/usr/bin/env python
"""GPU time of ATen and of chosen Inductor Triton mm configs per swept shape, by cutetune's
own timing method rather than Inductor's benchmark.

The Triton sweep (scripts/triton_mm_sweep.py) keeps what max-autotune measured: operands warm
in L2, a handful of repeats. Its ATen times of one weight matrix differ up to 4x between M values
that move nearly the same bytes (1024x4096: 9.8 to 42.9 us in
data/inputs/triton_mm/h200_bf16.jsonl.gz), too noisy to decide predicted mode's question,
Triton or ATen. This script times, for each shape predicted mode asks the Triton table about,
ATen (torch.mm into an out tensor, the call Inductor's extern kernel makes) and Triton configs
(the table's pick for the shape's group and the sweep's --top fastest configs: the heuristics
give a retimed shape the one that ran it fastest) with tuner.measure's method: L2-cold rotating
operands, warm-up, a GPU sleep ahead of the timed launches so that the events time kernels
alone, and rounds that interleave the variants. Each Triton config is compiled through predicted
mode's own path, as under CUDA graphs (no host-bound limit) with heuristics whose retime ran
every shape fastest in that config, so that any shape takes it, and the generated code is
checked to hold it.

  python scripts/triton_mm_retime.py --sweep data/inputs/triton_mm/h200_bf16.jsonl.gz \\
      --out data/bench/triton_mm/h200_bf16_retimed.jsonl [--top 1] [--budget-s 400]

With --family (a model family of the sweep, benchlib.FAMILIES) and --ms, every swept shape of
that family at those M is retimed, host-bound or not: under CUDA graphs every GEMM is decided
by GPU time (models/gpu_times.py). --quack-top K times the packaged heuristics' K best quack
configs for the shape in the same rounds (launched as compiled code launches them), so that
ATen, Triton and quack are compared on one set of timings:

  python scripts/triton_mm_retime.py --sweep data/inputs/triton_mm/h200_bf16.jsonl.gz \\
      --family llama3_8b --ms 1 4 16 64 128 256 --top 4 --quack-top 3 \\
      --out data/inputs/triton_mm/h200_bf16_retimed_graphs.jsonl

Rows are appended one shape at a time; shapes already in --out are skipped (resumable).
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import numpy as np

from cutetune.models.triton_mm import (CONFIG_KEYS, SweepShape, TritonTable, config_key, group_key,
    load_sweep)
from cutetune.space.problem import GemmProblem
from cutetune.models.heuristics import predicted_triton_shapes
from cutetune.models.triton_sweep import append_row, shapes_in
from cutetune.models.triton_mm import QUACK_CONFIG


def candidates(shape: SweepShape, picks: dict, top: int = 1) -> dict[str, dict[str, int]]:
    """The Triton configs to time for ``shape``: its group's pick ("pick", fitted on the whole
    sweep) and the sweep's ``top`` fastest configs ("sweep_best", "sweep_2", ...), once each."""
    out = {}
    pick = picks.get(group_key(shape.majors, shape.m, shape.n))
    if pick is not None:
        out["pick"] = pick.kwargs()
    ranked = sorted(shape.triton_ms, key=lambda c: (shape.triton_ms[c], c))[:top]
    for i, c in enumerate(ranked, 1):
        if pick is None or c != pick.config:
            out["sweep_best" if i == 1 else f"sweep_{i}"] = dict(zip(CONFIG_KEYS, c))
    return out


class ForcedTable:
    """A heuristics stand-in whose retime ran every shape fastest in one Triton config: with
    no host-bound limit ``decide`` hands any shape, host-bound or not, that config alone
    (``gpu_time_decision``) before it asks anything else."""

    def __init__(self, config: dict[str, int]) -> None:
        self.config = config
        self.digest = "retime:" + ",".join(f"{k}={v}" for k, v in sorted(config.items()))

    def lookup(self, problem):  # what enable() takes heuristics by; gpu_fastest answers first
        raise RuntimeError(f"{problem}: the retime compiles with no host-bound limit, where "
                           "gpu_fastest decides")

    def gpu_fastest(self, problem) -> tuple[str, tuple[int, ...]]:
        return "triton", config_key(self.config)


def compile_triton_mm(config: dict[str, int], a, b):
    """``fn(a, b, d)`` running Inductor's Triton mm template with ``config`` (returns the
    product); RuntimeError when the generated code does not hold that config alone. Compiled
    with ``QUACK_LAUNCH_HOST_US`` 0, as under CUDA graphs but without Inductor's cudagraphs,
    which would wrap the code in graph replays that copy each call's operands in."""
    from unittest import mock

    import torch
    from torch._inductor.utils import run_and_get_code

    from cutetune.tuner import inductor as ci
    from cutetune.tuner.inductor import decisions

    class MM(torch.nn.Module):
        def forward(self, x, y):
            return torch.mm(x, y)

    gm = torch.fx.symbolic_trace(MM())
    with (mock.patch.object(decisions, "QUACK_LAUNCH_HOST_US", 0.0),
          ci.enable("predicted", model=ForcedTable(config))):
        compiled, code = run_and_get_code(lambda: torch._inductor.compile(gm, [a, b]))
    code = "\n".join(code)
    held = {k: int(v) for k, v in re.findall(r"\b(BLOCK_[MNK])\s*:\s*tl\.constexpr\s*=\s*(\d+)",
                                              code)}
    want = {k: config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")}
    if "extern_kernels.mm(" in code or held != want:
        raise RuntimeError(f"generated code does not run Triton config {config} "
                           f"(tiles in code: {held or 'none'})")
    return lambda x, y, d: compiled(x, y)


def quack_candidates(problem: GemmProblem, top: int) -> dict:
    """The packaged heuristics' ``top`` best quack configs valid for ``problem``, as
    "quack_1", "quack_2", ... (none where ``top`` is 0)."""
    from cutetune.models.heuristics import PackagedHeuristics
    from cutetune.space.rules import is_valid

    if top <= 0:
        return {}
    configs = [c for c in PackagedHeuristics().lookup(problem)[0]
               if is_valid(c, problem.arch, problem)]
    return {f"quack_{i}": c for i, c in enumerate(configs[:top], 1)}


def retime_shape(shape: SweepShape, configs: dict[str, dict[str, int]], rounds: int,
                 l2_bytes: int, quack_top: int = 0) -> dict:
    import torch

    from cutetune.tuner.kernels.launcher import quack_mm_out
    from cutetune.tuner.kernels.problems import config_tuple
    from cutetune.tuner.measure.timing import ProblemBuffers, TimingPolicy, time_launches

    problem = GemmProblem(shape.m, shape.n, shape.k, a_major=shape.majors[0],
                          b_major=shape.majors[1])
    buf = ProblemBuffers(problem, l2_bytes)
    variants = {"aten": lambda a, b, d: torch.mm(a, b, out=d)}
    compile_s, errors = {}, {}
    for name, config in configs.items():
        t0 = time.perf_counter()
        try:
            variants[name] = compile_triton_mm(config, *buf.sets[0][:2])
        except Exception as e:  # noqa: BLE001  (recorded; the other variants are still timed)
            errors[name] = f"{type(e).__name__}: {e}"[:500]
        compile_s[name] = time.perf_counter() - t0
    quack = quack_candidates(problem, quack_top)
    for name, c in quack.items():
        variants[name] = (lambda fields: lambda a, b, d: quack_mm_out(a, b, d, fields))(
            config_tuple(c))
    policy = TimingPolicy(warmup=3, min_reps=10, max_reps=30, target_ms=2.0)
    times = {name: [] for name in variants}
    rel_err = dict.fromkeys(variants, 0.0)
    names = list(variants)
    for r in range(rounds):  # each round starts with another variant
        for name in names[r % len(names):] + names[:r % len(names)]:
            t, err = time_launches(variants[name], buf, policy)
            times[name] += t
            rel_err[name] = max(rel_err[name], err)
    timed = {name: {"ms": float(np.median(t)), "p20_ms": float(np.quantile(t, 0.2)),
                    "p80_ms": float(np.quantile(t, 0.8)), "reps": len(t),
                    "rel_err": rel_err[name],
                    **({"config": configs[name], "compile_s": compile_s[name]}
                       if name in configs else {}),
                    **({QUACK_CONFIG: quack[name].to_dict()} if name in quack else {})}
             for name, t in times.items()}
    return {"m": shape.m, "n": shape.n, "k": shape.k, "majors": shape.majors,
            "dtype": shape.dtype, "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "method": "L2-cold rotating operands, GPU sleep ahead, "
            f"{rounds} interleaved rounds, median", "timed": timed,
            "sweep_ms": {"aten": shape.aten_ms,
                         **{name: shape.triton_ms.get(config_key(c))
                            for name, c in configs.items()}},
            **({"errors": errors} if errors else {})}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", required=True, type=Path, nargs="+")
    ap.add_argument("--out", required=True, type=Path, help="JSONL file, appended")
    ap.add_argument("--arch", default="sm90")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--top", type=int, default=1,
                    help="time the sweep's this many fastest configs beside the pick")
    ap.add_argument("--family", help="retime every swept shape of this model family at --ms "
                    "(benchlib.FAMILIES), host-bound or not")
    ap.add_argument("--ms", type=int, nargs="+", help="with --family: the M values")
    ap.add_argument("--quack-top", type=int, default=0,
                    help="time the heuristics' this many best quack configs beside")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no new shape after this many seconds")
    args = ap.parse_args()
    t_start = time.perf_counter()
    import torch
    from torch._inductor import config as inductor_config

    swept = [s for p in args.sweep for s in load_sweep(p)]
    shapes = predicted_triton_shapes(swept, args.arch, args.dtype)
    picks = TritonTable.from_sweep(shapes).picks
    if args.family:
        from benchlib import family_of

        shapes = [s for s in swept if family_of(s.n, s.k) == args.family
                  and (not args.ms or s.m in args.ms) and s.dtype == args.dtype]
    done = shapes_in(args.out)
    todo = [s for s in shapes if (s.m, s.n, s.k, s.majors) not in done]
    print(f"{len(done)} shapes already in {args.out}, {len(todo)} to time", flush=True)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    # every graph compiles its own code (checked against the config); Triton's kernel cache
    # still spares the recompile of a config already built
    with inductor_config.patch(fx_graph_cache=False):
        for s in todo:
            if args.budget_s is not None and time.perf_counter() - t_start > args.budget_s:
                print("budget spent; re-run to resume", flush=True)
                break
            try:
                row = retime_shape(s, candidates(s, picks, args.top), args.rounds, l2,
                                   args.quack_top)
            except Exception as e:  # noqa: BLE001  (recorded, the run goes on)
                row = {"m": s.m, "n": s.n, "k": s.k, "majors": s.majors,
                       "error": f"{type(e).__name__}: {e}"[:1000]}
            append_row(args.out, row)
            t = row.get("timed", {})
            print(f"{s.majors} M={s.m} N={s.n} K={s.k}: " + (row.get("error") or ", ".join(
                f"{n} {v['ms'] * 1e3:.1f} us" for n, v in t.items())), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
