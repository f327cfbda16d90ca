"""Named problem suites: the linear layers of real LLMs, and log-uniform random shapes.

A suite is a list of (suite_name, GemmProblem). LLM layers use nn.Linear's layout (A is the
row-major activation, B the transposed weight: both K-major) with tensor parallelism 1.
"""

from __future__ import annotations

import math
import random

from .problem import DTYPE_BYTES, GemmProblem

# (N, K) of each dense projection: out_features, in_features. Fused QKV / gate-up where the
# reference implementation fuses them, separate where it does not.
LLM_LAYERS: dict[str, dict[str, tuple[int, int]]] = {
    "llama3_8b": {"q_o": (4096, 4096), "kv": (1024, 4096), "gate_up": (14336, 4096),
                  "down": (4096, 14336), "qkv": (6144, 4096)},
    "llama3_70b": {"q_o": (8192, 8192), "kv": (1024, 8192), "gate_up": (28672, 8192),
                   "down": (8192, 28672)},
    "qwen2.5_7b": {"q_o": (3584, 3584), "kv": (512, 3584), "gate_up": (18944, 3584),
                   "down": (3584, 18944)},
    "qwen2.5_72b": {"q_o": (8192, 8192), "kv": (1024, 8192), "gate_up": (29568, 8192),
                    "down": (8192, 29568)},
    "mixtral_8x22b": {"q_o": (6144, 6144), "kv": (1024, 6144), "expert_up": (16384, 6144),
                      "expert_down": (6144, 16384)},
    "mistral_nemo_12b": {"q": (4096, 5120), "o": (5120, 4096), "kv": (1024, 5120),
                         "gate_up": (14336, 5120), "down": (5120, 14336)},
    "deepseek_v3": {"q_a": (1536, 7168), "q_b": (24576, 1536), "kv_a": (576, 7168),
                    "kv_b": (32768, 512), "o": (7168, 16384), "dense_up": (18432, 7168),
                    "dense_down": (7168, 18432), "expert_up": (2048, 7168),
                    "expert_down": (7168, 2048)},
    "phi3_mini": {"qkv": (9216, 3072), "o": (3072, 3072), "gate_up": (16384, 3072),
                  "down": (3072, 8192)},
    "gemma2_9b": {"q": (4096, 3584), "kv": (2048, 3584), "o": (3584, 4096),
                  "gate_up": (14336, 3584), "down": (3584, 14336)},
}
LLM_M = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# Problems above this many FLOPs take several ms per launch; they are left out of the
# measured suites to keep a full sweep affordable (they are compute-bound and ranked well
# by the smaller large-M shapes anyway).
MAX_SUITE_FLOPS = 2**41


def llm_problems(dtype: str = "bf16", arch: str = "sm90", m_values=LLM_M,
                 max_flops: int = MAX_SUITE_FLOPS) -> list[tuple[str, GemmProblem]]:
    seen, out = set(), []
    for family, layers in LLM_LAYERS.items():
        for n, k in layers.values():
            for m in m_values:
                p = GemmProblem(m, n, k, dtype=dtype, out_dtype=dtype, arch=arch)
                if p.flops <= max_flops and (m, n, k) not in seen:
                    seen.add((m, n, k))
                    out.append((family, p))
    return out


def random_problems(count: int, seed: int = 0, dtype: str = "bf16", arch: str = "sm90",
                    max_flops: int = MAX_SUITE_FLOPS) -> list[tuple[str, GemmProblem]]:
    """Log-uniform M in 1..16384 and N, K in 256..32768, aligned for the dtype (N and K
    rounded to 16-byte multiples); shapes above ``max_flops`` are redrawn."""
    rng = random.Random(seed)
    align = 16 // DTYPE_BYTES[dtype]
    draw = lambda lo, hi: int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))  # noqa: E731
    out = []
    while len(out) < count:
        m = draw(1, 16384)
        n = max(align, draw(256, 32768) // align * align)
        k = max(align, draw(256, 32768) // align * align)
        p = GemmProblem(m, n, k, dtype=dtype, out_dtype=dtype, arch=arch)
        if p.flops <= max_flops:
            out.append(("random", p))
    return out


def train_problems(dtype: str = "bf16", arch: str = "sm90", seed: int = 0, n_llm: int = 200,
                   n_random: int = 120):
    """The sampled training suite: ``n_llm`` LLM layers drawn from ``llm_problems`` plus
    ``n_random`` random shapes (with configs sampled per problem by the collector)."""
    llm = llm_problems(dtype, arch)
    picked = random.Random(seed).sample(llm, min(n_llm, len(llm)))
    return picked + random_problems(n_random, seed, dtype, arch)


SUITES = {
    "llm": llm_problems,
    "random": lambda dtype, arch, seed: random_problems(120, seed, dtype, arch),
    "train": train_problems,
    "exhaustive": lambda dtype, arch, seed: exhaustive_problems(dtype, arch, seed + 1),
}


def suite(name: str, dtype: str = "bf16", arch: str = "sm90", seed: int = 0):
    """Problems of a named suite (see SUITES); 'a+b' concatenates suites."""
    out = []
    for part in name.split("+"):
        if part not in SUITES:
            raise ValueError(f"unknown problem suite {part!r}; known: {', '.join(SUITES)} "
                             "(or pass a JSON file of problems)")
        fn = SUITES[part]
        out += fn(dtype, arch) if part == "llm" else fn(dtype, arch, seed)
    return out


def exhaustive_problems(dtype: str = "bf16", arch: str = "sm90", seed: int = 1,
                        count: int = 40, max_flops: int = 2**38):
    """Problems for full sweeps: half LLM layers, half random, every M bucket covered, and
    cheap enough (<= 2^38 FLOPs) that sweeping thousands of configs stays affordable."""
    rng = random.Random(seed)
    llm = [x for x in llm_problems(dtype, arch, max_flops=max_flops)]
    rnd = random_problems(count * 4, seed + 1000, dtype, arch, max_flops=max_flops)
    buckets = [(1, 64), (65, 512), (513, 4096), (4097, 1 << 30)]
    picked = []
    for pool in (llm, rnd):
        for lo, hi in buckets:
            cands = [x for x in pool if lo <= x[1].m <= hi]
            rng.shuffle(cands)
            picked += cands[: count // 8]
    return [(f"{s}_exhaustive", p) for s, p in picked]
