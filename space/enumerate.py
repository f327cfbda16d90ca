"""The search space: per-arch axes, filtered by the rules in ``rules``."""

from __future__ import annotations

import itertools
import random
from functools import lru_cache

from .config import KernelConfig
from .problem import ARCHES, GemmProblem, ProblemError
from .rules import PROBLEM_RULES, is_valid

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


def check_arch(arch: str) -> str:
    if arch not in AXES:
        raise ProblemError(f"unknown arch {arch!r}; supported: {', '.join(ARCHES)}")
    return arch


def grid(arch: str):
    """Every point of the arch's axes, valid or not."""
    a = AXES[check_arch(arch)]
    for tm, tn, pp, (cm, cn), sw, swz, sk, dyn in itertools.product(
        a["tile_m"], a["tile_n"], a["pingpong"], a["cluster"], a["swap_ab"],
        a["max_swizzle_size"], a["split_k"], a["is_dynamic_persistent"],
    ):
        yield KernelConfig(tm, tn, pp, cm, cn, sw, swz, sk, dyn)


@lru_cache(maxsize=None)
def _valid(arch: str) -> tuple[KernelConfig, ...]:
    return tuple(c for c in grid(arch) if is_valid(c, arch))


def enumerate_configs(arch: str, problem: GemmProblem | None = None) -> list[KernelConfig]:
    """All valid configs of ``arch`` (for ``problem`` when given), in a stable order."""
    configs = _valid(check_arch(arch))
    if problem is None:
        return list(configs)
    rules = [r.check for r in PROBLEM_RULES if arch in r.arches]
    return [c for c in configs if all(check(c, problem) for check in rules)]


def compile_keys(configs) -> list[KernelConfig]:
    """Distinct compiled kernels behind ``configs``, in first-seen order."""
    return list(dict.fromkeys(c.compile_key() for c in configs))


def sample_configs(arch: str, n: int, seed: int = 0, problem: GemmProblem | None = None):
    """``n`` distinct valid configs drawn uniformly (all of them if fewer)."""
    configs = enumerate_configs(arch, problem)
    if n >= len(configs):
        return configs
    return random.Random(seed).sample(configs, n)
