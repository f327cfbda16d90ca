"""The model's inputs: space features of (problem, config) rows, for a dataset or one problem.

The columns and their order are the problem kind's (``kinds.ProblemKind.feature_names``:
``space.features.FEATURE_NAMES`` for dense GEMMs, ``GROUPED_FEATURE_NAMES`` for grouped ones);
an artifact records them and refuses to load under another schema. Ranking one problem's whole
space reuses the config columns of the valid configs of its family, computed once, so a query
only adds the problem columns and the derived features.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..space.config import KernelConfig, quack_default_config
from ..space.device import DeviceSpec
from ..space.enumerate import enumerate_configs
from ..space.features import config_columns
from ..space.rules import family_of, family_rules

from .kinds import DENSE, ProblemKind, kind_of

if TYPE_CHECKING:  # a model loads without the dataset's reader (pyarrow), which a compile would pay
    from .data import Measurements


def dataset_features(data: Measurements, device: DeviceSpec) -> np.ndarray:
    """float32 (rows, len(feature names of the data's kind)) for every row of ``data``."""
    return data.kind.matrix(data.cols, device)


def problem_descriptors(problems, device: DeviceSpec, kind: ProblemKind | None = None
                        ) -> np.ndarray:
    """(problems, len(kind.problem_features)): the problem-only features of each problem (all
    of one kind: ``kind``, else the first problem's)."""
    kind = kind or (kind_of(problems[0]) if problems else DENSE)
    if not problems:
        return np.empty((0, len(kind.problem_features)), np.float32)
    cfg = quack_default_config(problems[0].arch)  # any config: these features ignore it
    cols = config_columns([cfg] * len(problems))
    for f in kind.problem_columns:
        cols[f] = np.array([getattr(p, f) for p in problems])
    return kind.matrix(cols, device)[:, kind.problem_idx]


@dataclass(frozen=True)
class ConfigTable:
    """Configs with their columns precomputed, so featurizing them for a problem is vector work."""

    configs: tuple[KernelConfig, ...]
    cols: dict[str, np.ndarray]

    @classmethod
    def of(cls, configs) -> "ConfigTable":
        configs = tuple(configs)
        return cls(configs, config_columns(configs))

    def valid_mask(self, problem) -> np.ndarray:
        """Which configs pass the problem rules of the problem's family (the config rules are
        the caller's: the family's enumerated configs already pass them)."""
        rules = family_rules(family_of(problem), problem.arch, problem=True)
        return np.array([all(r.check(c, problem) for r in rules) for c in self.configs], bool)

    def features(self, problem, device: DeviceSpec, mask: np.ndarray | None = None) -> np.ndarray:
        cols = self.cols if mask is None else {k: v[mask] for k, v in self.cols.items()}
        n = len(next(iter(cols.values())))
        kind = kind_of(problem)
        return kind.matrix({**cols, **kind.columns(problem, n)}, device)


def arch_config_table(arch: str, family: str = "dense") -> ConfigTable:
    """Every valid config of ``arch`` in the config family ``family`` (the space a model ranks
    when given no candidates)."""
    return ConfigTable.of(enumerate_configs(arch, family=family))
