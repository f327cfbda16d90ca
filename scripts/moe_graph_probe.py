"""One-off CPU probe (deleted after its run; the result is data/reports/moe_graph_probe_cpu.json):
does predicted mode's compiled MoE block training step (scripts/bench_moe.py's block, a dynamic
token count) launch anything Inductor's default does not, beside its grouped GEMMs' calls?
Compiles the step on the CPU twice, plain and with the grouped pass of a picker that picks one
config for every GEMM (the CPU taken for sm90), and lists each graph's kernels and extern calls
and the weight gradients' strides against the parameters'.

    python scripts/moe_graph_probe.py --out data/reports/moe_graph_probe_cpu.json
"""

import argparse
import json
import re
import sys
from pathlib import Path

import torch
from torch._inductor import config as inductor_config
from torch._inductor.utils import run_and_get_code

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_moe  # noqa: E402

from cutetune.space.config import KernelConfig  # noqa: E402
from cutetune.space.suites import MOE_MODELS  # noqa: E402
from cutetune.tuner.inductor.passes import GroupedMmPass  # noqa: E402
from cutetune.tuner.kernels import grouped_mm as gmm  # noqa: E402

CALL = re.compile(r"^\s+(?:\w+ = )?(cpp_fused_\w+|extern_kernels\.\w+|cutetune_quack_grouped_mm|"
                  r"torch\.ops\.\w+\.\w+(?:\.\w+)?|aten\.\w+(?:\.\w+)?)\(", re.M)


class OnePick:
    def rank(self, problem, top_k=None):
        return [(KernelConfig(tile_m=128, tile_n=128), 1.0)]

    def prefers_aten(self, problem, configs=None):
        return False


def compiled(mode: str, layer, tokens: int) -> dict:
    torch.manual_seed(0)
    torch._dynamo.reset()
    module = bench_moe.moe_block(torch, layer, lambda a, b, offs: torch._grouped_mm(a, b, offs=offs),
                                 device="cpu")
    x = torch.randn(tokens, layer.hidden, dtype=torch.bfloat16)
    torch._dynamo.maybe_mark_dynamic(x, 0)
    step = bench_moe.block_step(torch, module, "default", True)
    patch = {"fx_graph_cache": False}
    if mode == "predicted":
        patch["post_grad_custom_post_pass"] = GroupedMmPass(gmm.Picker(OnePick()), "probe",
                                                            lambda device: "sm90")
    with inductor_config.patch(patch):
        _, codes = run_and_get_code(lambda: step(x, torch.randn_like(x)))
    graphs = [CALL.findall(code[code.index("def call("):]) for code in codes]
    return {"graphs": graphs, "weight_grads": {
        name: {"shape": list(p.shape), "grad_stride": list(p.grad.stride()),
               "param_stride": list(p.stride())} for name, p in module.named_parameters()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args()
    layer = MOE_MODELS["qwen3_30b_a3b"]
    modes = {m: compiled(m, layer, args.tokens) for m in ("default", "predicted")}
    grouped = ("extern_kernels._grouped_mm", "extern_kernels.cutetune_quack_grouped_mm")
    rest = {m: [[k for k in g if not k.startswith(grouped)] for g in r["graphs"]]
            for m, r in modes.items()}
    result = {"command": " ".join(sys.argv), "torch": torch.__version__,
              "layer": layer._asdict(), "tokens": args.tokens, **modes,
              "same_besides_grouped_calls": rest["default"] == rest["predicted"],
              "grouped_calls": {m: sum(k.startswith(grouped) for g in r["graphs"] for k in g)
                                for m, r in modes.items()}}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("same_besides_grouped_calls", "grouped_calls")}))


if __name__ == "__main__":
    main()
