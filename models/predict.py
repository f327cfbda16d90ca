"""Rank kernel configs of one GEMM problem (dense or grouped) with a trained cost model."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError
from ..space.config import KernelConfig
from ..space.problem import GemmProblem, GroupedProblem

from .artifact import CostModel, load_model
from .kinds import kind_of


def predict(problem: GemmProblem | GroupedProblem, top_k: int | None = 10, configs=None,
            model: CostModel | str | Path | None = None) -> list[tuple[KernelConfig, float]]:
    """(config, predicted ms), fastest first. ``model``: a CostModel, a model file, or None for
    the shipped model of the problem's kind, arch and dtype; ``configs`` None ranks all valid
    ones."""
    if not isinstance(model, CostModel):
        model = load_model(model, problem.arch, problem.dtype, kind_of(problem).name)
    return model.rank(problem, configs, top_k)


def read_configs(path: str | Path, arch: str | None = None) -> list[KernelConfig]:
    """A JSON list of config objects with quack's GemmConfig field names, read strictly
    (``KernelConfig.from_dict``; ``arch`` checks device_capacity); a config given twice is an
    error, since it would be ranked twice. UserError names the file and the entry."""
    try:
        items = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read configs from {path}: {e}") from None
    if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
        raise UserError(f"{path} must hold a JSON list of config objects")
    first: dict[KernelConfig, int] = {}
    for i, item in enumerate(items):
        try:
            c = KernelConfig.from_dict(item, arch)
        except (TypeError, ValueError) as e:
            raise UserError(f"{path}: config #{i}: {e}") from None
        if c in first:
            raise UserError(f"{path}: config #{i} repeats config #{first[c]} ({c.short()})")
        first[c] = i
    return list(first)
