"""The model's inputs: space features of (problem, config) rows, for a dataset or one problem.

The columns and their order are ``space.features.FEATURE_NAMES`` (raw problem and config
fields, then derived features); an artifact records them and refuses to load under another
schema. Ranking one problem's whole space reuses the config columns of the arch's valid
configs, computed once, so a query only adds the problem columns and the derived features.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..space.config import KernelConfig, quack_default_config
from ..space.device import DeviceSpec
from ..space.enumerate import enumerate_configs
from ..space.features import FEATURE_NAMES, config_columns, feature_matrix, problem_columns
from ..space.problem import GemmProblem
from ..space.rules import PROBLEM_RULES

from .data import Measurements

# Features that depend on the problem only: what the cuBLAS-fallback model sees of a problem.
PROBLEM_FEATURES = ("m", "n", "k", "batch", "in_bytes", "out_bytes", "a_m_major", "b_n_major",
                    "log2_m", "log2_n", "log2_k", "log2_batch", "log2_flops", "log2_ai_problem",
                    "log2_footprint_over_l2", "log2_ideal_s")
_PROBLEM_IDX = [FEATURE_NAMES.index(f) for f in PROBLEM_FEATURES]
ROOFLINE_IDX = FEATURE_NAMES.index("roofline_s")


def dataset_features(data: Measurements, device: DeviceSpec) -> np.ndarray:
    """float32 (rows, len(FEATURE_NAMES)) for every row of ``data``."""
    return feature_matrix(data.cols, device)


def problem_descriptors(problems, device: DeviceSpec) -> np.ndarray:
    """(problems, len(PROBLEM_FEATURES)): the problem-only features of each problem."""
    if not problems:
        return np.empty((0, len(PROBLEM_FEATURES)), np.float32)
    cfg = quack_default_config(problems[0].arch)
    cols = config_columns([cfg] * len(problems))
    for f in ("m", "n", "k", "batch", "dtype", "out_dtype", "a_major", "b_major", "arch"):
        cols[f] = np.array([getattr(p, f) for p in problems])
    return feature_matrix(cols, device)[:, _PROBLEM_IDX]


@dataclass(frozen=True)
class ConfigTable:
    """Configs with their columns precomputed, so featurizing them for a problem is vector work."""

    configs: tuple[KernelConfig, ...]
    cols: dict[str, np.ndarray]

    @classmethod
    def of(cls, configs) -> "ConfigTable":
        configs = tuple(configs)
        return cls(configs, config_columns(configs))

    def valid_mask(self, problem: GemmProblem) -> np.ndarray:
        """Which configs pass the problem rules (the config rules are the caller's: the arch's
        enumerated configs already pass them)."""
        rules = [r for r in PROBLEM_RULES if problem.arch in r.arches]
        return np.array([all(r.check(c, problem) for r in rules) for c in self.configs], bool)

    def features(self, problem: GemmProblem, device: DeviceSpec,
                 mask: np.ndarray | None = None) -> np.ndarray:
        cols = self.cols if mask is None else {k: v[mask] for k, v in self.cols.items()}
        n = len(next(iter(cols.values())))
        return feature_matrix({**cols, **problem_columns(problem, n)}, device)


def arch_config_table(arch: str) -> ConfigTable:
    """Every valid config of ``arch`` (the space a model ranks when given no candidates)."""
    return ConfigTable.of(enumerate_configs(arch))
