"""The search space: per-arch axes, filtered by the rules in ``rules``."""

from __future__ import annotations

import itertools
import random
from functools import lru_cache

from .config import KernelConfig
from .problem import ARCHES, GemmProblem, GroupedProblem, ProblemError
from .rules import family_of, family_rules, is_valid

# (4, 4) is rejected by cluster_shape (16 CTAs is not a portable cluster size).
CLUSTERS = ((1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (1, 4), (4, 4))

# Values each knob may take before the rules filter; tile_n runs in steps of 16 to 64, then 32,
# plus quack's 208 (the widest pingpong tile at tile_m 128). Each axis also holds the nearest
# values that some rule rejects (sm90 dynamic persistence, sm100 pingpong and tile_n 512, the
# 4x4 cluster), so every rule is exercised by the grid and `cutetune space check --rejected`
# can put each one before the compiler; they never reach the valid space.
AXES: dict[str, dict[str, tuple]] = {
    "sm90": {
        "tile_m": (64, 128, 192, 256),
        "tile_n": (16, 32, 48, 64, 96, 128, 160, 192, 208, 256),
        "pingpong": (True, False),
        "cluster": CLUSTERS,
        "swap_ab": (False, True),
        "max_swizzle_size": (1, 8),
        "split_k": (1, 2, 4),
        "is_dynamic_persistent": (False, True),
    },
    "sm100": {
        "tile_m": (64, 128, 256),
        "tile_n": (16, 32, 64, 96, 128, 160, 192, 224, 256, 512),
        "pingpong": (False, True),
        "cluster": CLUSTERS,
        "swap_ab": (False, True),
        "max_swizzle_size": (1, 8),
        "split_k": (1, 2, 4),
        "is_dynamic_persistent": (True, False),
    },
}


# The grouped families' axes (varlen M and varlen K draw on the same ones). Narrower than the
# dense ones, to keep a full GPU-blind compile check of them affordable: tile_n starts at 64
# (an expert GEMM's N is rarely below 512, and swap_ab, which turns a small M into a small
# kernel N, is closed to varlen M) and clusters span at most 2 CTAs a side (quack's own lists
# go no further, and a 4-CTA cluster along M holds 4 row tiles of one expert). Split-K, the 4x4
# cluster, sm100's pingpong and its tile_n 512 are grid points the rules reject, so that every
# rule of the grouped families is exercised (as in AXES).
GROUPED_CLUSTERS = ((1, 1), (2, 1), (1, 2), (2, 2), (4, 4))
GROUPED_AXES: dict[str, dict[str, tuple]] = {
    "sm90": {
        "tile_m": (64, 128, 192, 256),
        "tile_n": (64, 96, 128, 160, 192, 208, 256),
        "pingpong": (True, False),
        "cluster": GROUPED_CLUSTERS,
        "swap_ab": (False, True),
        "max_swizzle_size": (1, 8),
        "split_k": (1, 2),
        "is_dynamic_persistent": (False, True),
    },
    "sm100": {
        "tile_m": (64, 128, 256),
        "tile_n": (64, 128, 160, 192, 224, 256, 512),
        "pingpong": (False, True),
        "cluster": GROUPED_CLUSTERS,
        "swap_ab": (False, True),
        "max_swizzle_size": (1, 8),
        "split_k": (1, 2),
        "is_dynamic_persistent": (True, False),
    },
}


def check_arch(arch: str) -> str:
    if arch not in AXES:
        raise ProblemError(f"unknown arch {arch!r}; supported: {', '.join(ARCHES)}")
    return arch


def axes(arch: str, family: str = "dense") -> dict[str, tuple]:
    """The values each knob may take on ``arch`` for configs of ``family``."""
    family_of(None, family)  # a known family
    return (AXES if family == "dense" else GROUPED_AXES)[check_arch(arch)]


def grid(arch: str, family: str = "dense"):
    """Every point of the axes of ``arch`` and ``family``, valid or not."""
    a = axes(arch, family)
    for tm, tn, pp, (cm, cn), sw, swz, sk, dyn in itertools.product(
        a["tile_m"], a["tile_n"], a["pingpong"], a["cluster"], a["swap_ab"],
        a["max_swizzle_size"], a["split_k"], a["is_dynamic_persistent"],
    ):
        yield KernelConfig(tm, tn, pp, cm, cn, sw, swz, sk, dyn)


@lru_cache(maxsize=None)
def _valid(arch: str, family: str) -> tuple[KernelConfig, ...]:
    return tuple(c for c in grid(arch, family) if is_valid(c, arch, family=family))


def enumerate_configs(arch: str, problem: GemmProblem | GroupedProblem | None = None,
                      family: str | None = None) -> list[KernelConfig]:
    """All valid configs of ``arch`` for ``problem`` when given (of its family: a
    GroupedProblem's are grouped configs), else of ``family`` (default dense), in a stable
    order."""
    fam = family_of(problem, family)
    configs = _valid(check_arch(arch), fam)
    if problem is None:
        return list(configs)
    rules = [r.check for r in family_rules(fam, arch, problem=True)]
    return [c for c in configs if all(check(c, problem) for check in rules)]


def compile_keys(configs) -> list[KernelConfig]:
    """Distinct compiled kernels behind ``configs``, in first-seen order."""
    return list(dict.fromkeys(c.compile_key() for c in configs))


def sample_configs(arch: str, n: int, seed: int = 0,
                   problem: GemmProblem | GroupedProblem | None = None):
    """``n`` distinct valid configs drawn uniformly (all of them if fewer)."""
    configs = enumerate_configs(arch, problem)
    if n >= len(configs):
        return configs
    return random.Random(seed).sample(configs, n)
