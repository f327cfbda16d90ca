"""Named problem suites: the linear layers of real LLMs, and log-uniform random shapes; for
grouped GEMMs, the expert GEMMs of MoE models, random ones, and routings of their rows.

A suite is a list of (suite_name, problem). LLM layers use nn.Linear's layout (A is the
row-major activation, B the transposed weight: both K-major) with tensor parallelism 1.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from .problem import (DTYPE_BYTES, GROUPED_GEMMS, GemmProblem, GroupedProblem, ProblemError,
                      grouped_family)

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
    out = []
    while len(out) < count:
        m = _log_uniform(rng, 1, 16384)
        n = _log_uniform(rng, 256, 32768, align)
        k = _log_uniform(rng, 256, 32768, align)
        p = GemmProblem(m, n, k, dtype=dtype, out_dtype=dtype, arch=arch)
        if p.flops <= max_flops:
            out.append(("random", p))
    return out


def _log_uniform(rng: random.Random, lo: int, hi: int, align: int = 1) -> int:
    """An integer drawn log-uniformly from [lo, hi], rounded down to a multiple of ``align``
    (at least ``align``)."""
    x = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
    return max(align, x // align * align)


def train_problems(dtype: str = "bf16", arch: str = "sm90", seed: int = 0, n_llm: int = 200,
                   n_random: int = 120):
    """The sampled training suite: ``n_llm`` LLM layers drawn from ``llm_problems`` plus
    ``n_random`` random shapes (with configs sampled per problem by the collector)."""
    llm = llm_problems(dtype, arch)
    picked = random.Random(seed).sample(llm, min(n_llm, len(llm)))
    return picked + random_problems(n_random, seed, dtype, arch)


# Batched GEMMs of attention without a fused kernel, per (batch x heads): scores Q K^T (M the
# queries, N the keys, K the head dim; both operands K-major) and their weighting of V (N the
# head dim, K the keys; V is N-major), at prefill (as many queries as keys) and decode sizes.
BMM_BATCHES = (2, 4, 8, 16, 32, 64)
BMM_KEYS = (128, 512, 1024, 2048, 4096)
BMM_HEAD_DIMS = (64, 128)
BMM_DECODE_QUERIES = (1, 16)


def bmm_problems(dtype: str = "bf16", arch: str = "sm90") -> list[tuple[str, GemmProblem]]:
    """The bmm suite: attention's two batched GEMMs at each batch, key count and head dim,
    prefill and decode (``BMM_*``)."""
    out = []
    for b in BMM_BATCHES:
        for keys in BMM_KEYS:
            for d in BMM_HEAD_DIMS:
                for q in (keys, *BMM_DECODE_QUERIES):
                    out.append(("attention_scores", GemmProblem(
                        q, keys, d, batch=b, dtype=dtype, out_dtype=dtype, arch=arch)))
                    out.append(("attention_values", GemmProblem(
                        q, d, keys, batch=b, b_major="n", dtype=dtype, out_dtype=dtype,
                        arch=arch)))
    return out


SUITES = {
    "llm": llm_problems,
    "random": lambda dtype, arch, seed: random_problems(120, seed, dtype, arch),
    "train": train_problems,
    "exhaustive": lambda dtype, arch, seed: exhaustive_problems(dtype, arch, seed + 1),
    "bmm": lambda dtype, arch, seed: bmm_problems(dtype, arch),
}
# Operand majors of a dense problem, A's then B's, each with the GEMM of a linear layer
# y = x W^T (x (M, K) and W (N, K) row-major) that has them: kk its forward (M, N, K), kn its
# input gradient dY W (M, K, N), mn its weight gradient dY^T X (N, K, M); mk, which a linear
# layer has none of, its forward's sizes with an M-major A.
LAYOUTS = ("kk", "kn", "mk", "mn")


def in_layout(p: GemmProblem, layout: str) -> GemmProblem:
    """The GEMM of ``LAYOUTS[layout]`` of the layer whose forward is ``p`` (kk); ProblemError
    where its sizes do not allow it (an M-major A needs M aligned for TMA)."""
    return {"kk": lambda: p,
            "kn": lambda: replace(p, n=p.k, k=p.n, b_major="n"),
            "mk": lambda: replace(p, a_major="m"),
            "mn": lambda: replace(p, m=p.n, n=p.k, k=p.m, a_major="m", b_major="n"),
            }[layout]()


def _named(names, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    """``names`` once each, in order; ValueError naming an unknown one (or none given)."""
    names = tuple(dict.fromkeys(names))
    unknown = [x for x in names if x not in known]
    if unknown or not names:
        raise ValueError(f"unknown {what} {', '.join(unknown) or '(none given)'}; known: "
                         f"{', '.join(known)}")
    return names


def check_layouts(layouts) -> tuple[str, ...]:
    """``layouts`` (names of ``LAYOUTS``) once each, in order."""
    return _named(layouts, LAYOUTS, "layout")


def in_layouts(problems, layouts) -> list[tuple[str, GemmProblem]]:
    """Each dense forward problem of ``problems`` as its GEMM of each of ``layouts``
    (``in_layout``), where its sizes allow it; grouped ones as they are (their GEMM sets their
    majors)."""
    layouts = check_layouts(layouts)
    out, seen = [], set()
    for name, p in problems:
        if not isinstance(p, GemmProblem):
            out.append((name, p))
            continue
        for layout in layouts:
            try:
                q = in_layout(p, layout)
            except ProblemError:
                continue
            if q not in seen:
                seen.add(q)
                out.append((name, q))
    return out


def suite(name: str, dtype: str = "bf16", arch: str = "sm90", seed: int = 0):
    """Problems of a named suite (see SUITES); 'a+b' concatenates suites."""
    return _concatenated(SUITES, name, dtype, arch, seed)


def _concatenated(suites: dict, name: str, dtype: str, arch: str, seed: int):
    out = []
    for part in name.split("+"):
        if part not in suites:
            raise ValueError(f"unknown problem suite {part!r}; known: {', '.join(suites)} "
                             "(or pass a JSON file of problems)")
        fn = suites[part]
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


# ---------------------------------------------------------------- grouped: MoE experts
class MoeLayer(NamedTuple):
    experts: int
    top_k: int  # experts per token: routed rows = tokens x top_k
    hidden: int
    intermediate: int  # of one expert


# Routed experts of each model, from its config.json (shared experts are dense GEMMs):
# DeepSeek-V3: inference/configs/config_671B.json (n_routed_experts, n_activated_experts, dim,
# moe_inter_dim); Qwen3: num_experts, num_experts_per_tok, hidden_size, moe_intermediate_size
# (as MindSpeed-RL's configs/model/qwen3_30b_a3b.yaml and qwen3_235b_a22b.yaml restate them);
# Mixtral (mistralai/Mixtral-8x7B-Instruct-v0.1, mistral-community/Mixtral-8x22B-v0.1), Phi-3.5
# (microsoft/Phi-3.5-MoE-instruct, as mlx-community's copy restates it) and Granite 3.1
# (ibm-granite/granite-3.1-{3b-a800m,1b-a400m}-instruct): num_local_experts,
# num_experts_per_tok, hidden_size, intermediate_size.
MOE_MODELS: dict[str, MoeLayer] = {
    "deepseek_v3": MoeLayer(256, 8, 7168, 2048),
    "qwen3_30b_a3b": MoeLayer(128, 8, 2048, 768),
    "qwen3_235b_a22b": MoeLayer(128, 8, 4096, 1536),
    "mixtral_8x7b": MoeLayer(8, 2, 4096, 14336),
    "mixtral_8x22b": MoeLayer(8, 2, 6144, 16384),
    "phi3.5_moe": MoeLayer(16, 2, 4096, 6400),
    "granite3.1_3b_a800m": MoeLayer(40, 8, 1536, 512),
    "granite3.1_1b_a400m": MoeLayer(32, 8, 1024, 512),
}
MOE_TOKENS = tuple(2**i for i in range(4, 17))  # tokens per step: 16 .. 65536, log-spaced


def expert_projections(layer: MoeLayer) -> dict[str, tuple[int, int]]:
    """(N, K) of an expert's projections, out_features and in_features: gate and up fused
    (N = 2 x intermediate), and down."""
    return {"gate_up": (2 * layer.intermediate, layer.hidden),
            "down": (layer.hidden, layer.intermediate)}


def expert_gemm(gemm: str, experts: int, rows: int, n_out: int, k_in: int, dtype: str = "bf16",
                arch: str = "sm90") -> GroupedProblem:
    """The grouped GEMM ``gemm`` of a projection with weights (experts, n_out, k_in) over
    ``rows`` routed rows: the forward Y = X W^T, the input gradient dX = dY W, or the weight
    gradient dW = dY^T X (varlen K: the rows are the reduction)."""
    grouped_family(gemm)  # a known GEMM
    m, n, k = {"fwd": (rows, n_out, k_in), "dgrad": (rows, k_in, n_out),
               "wgrad": (n_out, k_in, rows)}[gemm]
    return GroupedProblem(experts, m, n, k, gemm=gemm, dtype=dtype, out_dtype=dtype, arch=arch)


def moe_problems(dtype: str = "bf16", arch: str = "sm90", tokens=MOE_TOKENS,
                 max_flops: int = MAX_SUITE_FLOPS) -> list[tuple[str, GroupedProblem]]:
    """Every MoE model's expert GEMMs (both projections, each GEMM) at each token count, up to
    ``max_flops`` (as ``llm_problems``), named by model; shared problems once."""
    seen, out = set(), []
    for model, layer in MOE_MODELS.items():
        for n_out, k_in in expert_projections(layer).values():
            for gemm in GROUPED_GEMMS:
                for t in tokens:
                    p = expert_gemm(gemm, layer.experts, t * layer.top_k, n_out, k_in, dtype,
                                    arch)
                    if p.flops <= max_flops and p.key() not in seen:
                        seen.add(p.key())
                        out.append((model, p))
    return out


def random_grouped_problems(count: int, seed: int = 0, dtype: str = "bf16", arch: str = "sm90",
                            max_flops: int = MAX_SUITE_FLOPS
                            ) -> list[tuple[str, GroupedProblem]]:
    """Log-uniform experts in 4..256, tokens in 16..65536 and projection N, K in 512..16384
    (aligned for the dtype, as ``random_problems``), top-k of 1, 2, 4 or 8 (at most the
    experts) and each GEMM equally likely; problems above ``max_flops`` are redrawn."""
    rng = random.Random(seed)
    align = 16 // DTYPE_BYTES[dtype]
    out = []
    while len(out) < count:
        experts, tokens = _log_uniform(rng, 4, 256), _log_uniform(rng, 16, 65536)
        top_k = rng.choice([t for t in (1, 2, 4, 8) if t <= experts])
        n_out, k_in = (_log_uniform(rng, 512, 16384, align) for _ in range(2))
        p = expert_gemm(rng.choice(list(GROUPED_GEMMS)), experts, tokens * top_k, n_out, k_in,
                        dtype, arch)
        if p.flops <= max_flops:
            out.append(("moe_random", p))
    return out


def moe_large_problems(dtype: str = "bf16", arch: str = "sm90") -> list[tuple[str, GroupedProblem]]:
    """The MoE models' expert GEMMs that ``moe_problems`` leaves out (above MAX_SUITE_FLOPS, to
    65536 tokens), cheapest first. Without them the model extrapolates to a big model's
    training-sized steps, and its fallback, unsure there, runs torch._grouped_mm."""
    large = [(name, p) for name, p in moe_problems(dtype, arch, max_flops=2**45)
             if p.flops > MAX_SUITE_FLOPS]
    return sorted(large, key=lambda item: item[1].flops)


GROUPED_SUITES = {
    "moe": lambda dtype, arch, seed: moe_problems(dtype, arch),
    "moe_large": lambda dtype, arch, seed: moe_large_problems(dtype, arch),
    "moe_random": lambda dtype, arch, seed: random_grouped_problems(120, seed, dtype, arch),
}


def grouped_suite(name: str, dtype: str = "bf16", arch: str = "sm90", seed: int = 0):
    """Problems of a named grouped suite (see GROUPED_SUITES); 'a+b' concatenates suites."""
    return _concatenated(GROUPED_SUITES, name, dtype, arch, seed)


# ---------------------------------------------------------------- grouped: routings
ROUTINGS = ("balanced", "skewed", "empty")
SKEW_ALPHA = 1.0  # Dirichlet concentration of "skewed": expert loads spread like exponentials
EMPTY_FRACTION = 0.5  # experts without rows in "empty"


def check_routings(routings) -> tuple[str, ...] | None:
    """``routings`` (names of ``ROUTINGS``; None: one drawn per problem) once each, in
    order."""
    return None if routings is None else _named(routings, ROUTINGS, "routing")


def routing_counts(experts: int, rows: int, kind: str, seed: int = 0) -> np.ndarray:
    """Rows per expert (int64, ``experts`` long, summing to ``rows``) of a routing ``kind``:
    "balanced" (as even as can be, the remainder to a seeded choice of experts), "skewed"
    (multinomial over Dirichlet(SKEW_ALPHA) expert weights) or "empty" (EMPTY_FRACTION of the
    experts, at least one and never all, get none; the rest share the rows evenly at random).
    Deterministic in ``seed``."""
    for name, v, least in (("experts", experts, 1), ("rows", rows, 0)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < least:
            raise ProblemError(f"{name} must be an integer >= {least}, got {v!r}")
    if kind not in ROUTINGS:
        raise ProblemError(f"unknown routing {kind!r}; known: {', '.join(ROUTINGS)}")
    rng = np.random.default_rng([seed, experts, rows, ROUTINGS.index(kind)])
    if kind == "balanced":
        counts = np.full(experts, rows // experts, dtype=np.int64)
        counts[rng.permutation(experts)[: rows % experts]] += 1
        return counts
    if kind == "skewed":
        return rng.multinomial(rows, rng.dirichlet(np.full(experts, SKEW_ALPHA))).astype(np.int64)
    counts = np.zeros(experts, dtype=np.int64)
    full = rng.permutation(experts)[: max(1, experts - max(1, int(experts * EMPTY_FRACTION)))]
    counts[full] = rng.multinomial(rows, np.full(len(full), 1.0 / len(full)))
    return counts
