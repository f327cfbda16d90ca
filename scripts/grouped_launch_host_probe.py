"""One-off CPU probe (deleted after its run; result: data/reports/grouped_launch_host_cpu.json):
the host time of an eager grouped GEMM call that is not the compiled kernel's own call, per
part, on this CPU. quack's warm launch path (``quack_gemm.launch`` with quack's dispatch plan,
its TVM-FFI function stubbed out) for a static and an sm90 dynamic-scheduler config, and
cutetune's own layer (``grouped_mm_impl`` with its plan's run stubbed out).

    python scripts/grouped_launch_host_probe.py --out data/reports/grouped_launch_host_cpu.json
"""
import argparse
import json
import platform
import sys
import time

from cutetune.tuner.kernels.compile import configure_gpu_blind

E, M, N, K = 128, 1024, 1536, 2048  # Qwen3-30B-A3B's gate+up at 128 tokens, balanced


def bench(f, n=3000) -> float:
    for _ in range(300):
        f()
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cache", default="/tmp/grouped-launch-probe")
    args = ap.parse_args()
    configure_gpu_blind("sm90", args.cache)
    import torch

    from cutetune.space.config import KernelConfig
    from cutetune.space.problem import GroupedProblem
    from cutetune.tuner.kernels import grouped_mm as gmm, library, quack_gemm

    quack_gemm.import_quack()  # before _plan_only: gemm_interface binds run_gemm_plan at import
    a = torch.empty(M, K, dtype=torch.bfloat16)
    w = torch.empty(E, N, K, dtype=torch.bfloat16)
    d = torch.empty(M, N, dtype=torch.bfloat16)
    offs = (torch.arange(1, E + 1, dtype=torch.int32) * (M // E)).to(torch.int32)
    cu = torch.nn.functional.pad(offs, (1, 0))
    out = {"command": " ".join(sys.argv), "cpu": platform.processor() or platform.machine(),
           "problem": GroupedProblem(E, M, N, K).key(), "quack_path_us": {}}
    for name, cfg in (("static", KernelConfig(tile_m=128, tile_n=128)),
                      ("sm90_dynamic", KernelConfig(tile_m=128, tile_n=128,
                                                    is_dynamic_persistent=True))):
        plan = quack_gemm.MmPlan(cfg, "sm90")
        with library._plan_only(132):
            quack_gemm.launch(plan, a, w.mT, d, None, 1.0, 1.0, cu_seqlens_m=cu)
        calls = []
        plan.dispatch = plan.dispatch._replace(compiled_fn=lambda *x: calls.append(len(x)))
        us = bench(lambda: quack_gemm.launch(plan, a, w.mT, d, None, 1.0, 1.0,
                                             cu_seqlens_m=cu))
        assert calls, "the stubbed kernel call was not reached"
        out["quack_path_us"][name] = us
    plan = gmm.GroupedPlan(KernelConfig(tile_m=128, tile_n=128), GroupedProblem(E, M, N, K))
    plan.run, plan.via = (lambda *call: None), "quack"
    gmm._build_plan = lambda *x: plan
    torch.set_grad_enabled(False)
    out["cutetune_layer_us"] = bench(lambda: gmm.grouped_mm(a, w.mT, offs))
    # for scale, each alone: the pad runs in cutetune's launch, the zeros in quack's dynamic one
    out["single_ops_us"] = {
        "offsets_pad": bench(lambda: torch.nn.functional.pad(offs, (1, 0))),
        "output_empty": bench(lambda: torch.empty(M, N, dtype=torch.bfloat16)),
        "semaphore_zeros": bench(lambda: torch.zeros(1, dtype=torch.int32))}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
