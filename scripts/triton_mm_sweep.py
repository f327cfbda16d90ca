#!/usr/bin/env python
"""Inductor's own benchmark of ATen and every Triton mm config it offers, per small-M shape.

cutetune leaves host-bound GEMMs to Inductor; where they are also memory-bound, max-autotune's
Triton templates ran the step up to 1.5x faster than ATen (data/bench/step_h200.json.gz), and
predicted mode may not benchmark. `models/triton_mm.py` learns from these timings one config
per M bucket and N width, to offer without benchmarking. Each shape is a torch.mm compiled under
max-autotune (ATEN,TRITON) with Inductor's caches off; a feedback saver records the timings
Inductor measured for every choice, and the compiled result is checked against torch.mm.

  python scripts/triton_mm_sweep.py --out data/inputs/triton_mm/h200_bf16.jsonl [--budget-s 500]
      [--families llama3_8b ...] [--layers 4096:14336 ...] [--ms 1 4 16 ...] [--majors kk kn]
      [--search-space EXHAUSTIVE]

``--search-space EXHAUSTIVE`` benchmarks Inductor's exhaustive Triton mm list (every tile of
16 to 256 per dimension, 1 to 5 stages, 2 to 8 warps) instead of its short default one:
predicted mode can ask for any config of either (tuner/inductor.py).

Rows are appended one shape at a time; shapes already in --out are skipped (resumable).
The committed H200 sweep is that file compressed (gzip -9n):
data/inputs/triton_mm/h200_bf16.jsonl.gz; every reader of a sweep takes either.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchlib import FAMILIES

from cutetune.space.problem import GemmProblem
from cutetune.models.triton_sweep import append_row, shapes_in, sweep_row

MS = (1, 4, 16, 64, 128, 256)


def measure_shape(m: int, n: int, k: int, majors: str, search_space: str = "DEFAULT") -> dict:
    """Compile torch.mm of (M,K) x (K,N) in the given operand majors under max-autotune, with
    Inductor's Triton configs from ``search_space``, and return every choice Inductor
    benchmarked for it."""
    import torch
    from torch._inductor import config as inductor_config
    from torch._inductor.select_algorithm import get_algorithm_selector_cache

    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    # kk: b = W.t() of an (N, K) weight, as nn.Linear hands it; kn: b is (K, N) row-major
    b = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t() if majors == "kk"
         else torch.randn(k, n, device="cuda", dtype=torch.bfloat16))
    seen: list[tuple[str, dict]] = []

    def saver(timings, name, input_nodes, choices, profiler_bench_function,
              precompile_times=None):
        seen.append((name, dict(timings)))

    cache = get_algorithm_selector_cache()
    cache.add_feedback_saver(saver)
    torch._dynamo.reset()
    t0 = time.perf_counter()
    try:
        with inductor_config.patch(max_autotune_gemm=True,
                                   max_autotune_gemm_backends="ATEN,TRITON",
                                   max_autotune_gemm_search_space=search_space,
                                   force_disable_caches=True):
            out = torch.compile(lambda x, y: torch.mm(x, y), dynamic=False)(a, b)
            torch.cuda.synchronize()
    finally:
        cache.feedback_saver_fns.remove(saver)
    compile_s = time.perf_counter() - t0
    ref = torch.mm(a.float(), b.float())
    rel_err = float((out.float() - ref).norm() / ref.norm())
    mm = [t for name, t in seen if name == "mm"]
    if len(mm) != 1:
        raise RuntimeError(f"expected one mm benchmark, Inductor reported {[n for n, _ in seen]}")
    return sweep_row(GemmProblem(m, n, k, a_major=majors[0], b_major=majors[1]), mm[0],
                     torch.cuda.get_device_name(), torch.__version__, compile_s=compile_s,
                     rel_err=rel_err)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="JSONL file, appended")
    ap.add_argument("--ms", type=int, nargs="+", default=list(MS))
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    ap.add_argument("--layers", nargs="+", metavar="N:K",
                    help="only these (N, K) of the families' layers, in this order")
    ap.add_argument("--majors", nargs="+", default=["kk", "kn"], choices=["kk", "kn"])
    ap.add_argument("--search-space", default="DEFAULT", choices=["DEFAULT", "EXHAUSTIVE"])
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no new shape after this many seconds")
    args = ap.parse_args()
    t_start = time.perf_counter()
    done = shapes_in(args.out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    layers = [tuple(int(v) for v in nk.split(":")) for nk in args.layers or ()]
    todo = [(m, n, k, mj) for mj in args.majors for f in args.families for n, k in FAMILIES[f]
            for m in args.ms if (m, n, k, mj) not in done and (not layers or (n, k) in layers)]
    if layers:  # in the order given
        todo.sort(key=lambda t: layers.index((t[1], t[2])))
    print(f"{len(done)} shapes already in {args.out}, {len(todo)} to measure", flush=True)
    for m, n, k, majors in todo:
        if args.budget_s is not None and time.perf_counter() - t_start > args.budget_s:
            print("budget spent; re-run to resume", flush=True)
            break
        try:
            row = measure_shape(m, n, k, majors, args.search_space)
        except Exception as e:  # noqa: BLE001  (recorded, the sweep goes on)
            row = {"m": m, "n": n, "k": k, "majors": majors, "error": f"{type(e).__name__}: {e}"}
        append_row(args.out, row)
        best = row.get("choices", [{}])[0]
        print(f"{majors} M={m} N={n} K={k}: {row.get('error') or best.get('kind')} "
              f"{best.get('ms', float('nan')) * 1e3:.1f} us, {len(row.get('choices', []))} "
              f"choices, {row.get('compile_s', 0):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
