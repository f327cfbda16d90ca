"""The fleet's plan: problems x configs cut into work items, stored once in the study."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field


from ...models.dataset import measurement_key
from ...space.config import KernelConfig
from ...space.problem import GemmProblem
from ..measure.collect import configs_for, sample_quota
from ..search.storage import HOLDER_ATTR as WORKER_ATTR

PLAN_ATTR = "cutetune_plan"
ITEM_ATTR, ROWS_ATTR, ERROR_ATTR = "item", "rows_z", "error"
PLAN_VERSION = 1


# ---------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Work:
    """What a study measures; every item resolves its configs through ``candidates``.

    configs is 'all' or 'sample:N[@K]' (resolved per problem with the seed), or the config list
    of a JSON file, stored in the plan so that hosts without the file can run its items.
    """

    problems: str
    arch: str
    dtype: str
    configs: str | tuple[KernelConfig, ...]
    seed: int
    item_size: int

    def candidates(self, problem: GemmProblem) -> list[KernelConfig]:
        if isinstance(self.configs, str):
            return configs_for(problem, self.configs, self.seed)
        return list(self.configs)

    def to_dict(self) -> dict:
        cfg = self.configs if isinstance(self.configs, str) else [c.to_dict() for c in self.configs]
        return {"problems": self.problems, "arch": self.arch, "dtype": self.dtype,
                "configs": cfg, "seed": self.seed, "item_size": self.item_size}

    @classmethod
    def from_dict(cls, d: dict) -> "Work":
        cfg = d["configs"]
        cfg = cfg if isinstance(cfg, str) else tuple(KernelConfig.from_dict(c) for c in cfg)
        return cls(d["problems"], d["arch"], d["dtype"], cfg, int(d["seed"]), int(d["item_size"]))


@dataclass(frozen=True)
class WorkItem:
    """Some configs of one problem (indices into ``Work.candidates``, whose digest at planning
    is ``space``), and maybe its cuBLAS row."""

    key: str
    suite: str
    problem: GemmProblem
    indices: tuple[int, ...]
    cublas: bool
    space: str

    def to_json(self) -> list:
        return [self.key, self.suite, self.problem.to_dict(), _ranges(self.indices), self.cublas,
                self.space]

    @classmethod
    def from_json(cls, v: list) -> "WorkItem":
        key, suite, problem, ranges, cublas, space = v
        return cls(key, suite, GemmProblem(**problem),
                   tuple(i for a, b in ranges for i in range(a, b)), bool(cublas), space)


def space_digest(configs: list[KernelConfig]) -> str:
    return hashlib.sha256("|".join(c.short() for c in configs).encode()).hexdigest()[:12]


def _ranges(indices: tuple[int, ...]) -> list[list[int]]:
    """Sorted indices as [start, stop) runs: a plan of thousands of items stays small."""
    out: list[list[int]] = []
    for i in indices:
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return out


@dataclass(frozen=True)
class Plan:
    work: Work
    items: dict[str, WorkItem]
    _candidates: dict = field(default_factory=dict, compare=False, repr=False)

    def configs(self, item: WorkItem) -> list[KernelConfig]:
        """The item's configs; ValueError if this host enumerates another config space than
        the planning host did (another cutetune version), so indices would mean other configs."""
        p = item.problem
        if p not in self._candidates:
            if len(self._candidates) >= 64:  # bounded: 'all' is thousands of configs each
                self._candidates.clear()
            cands = self.work.candidates(p)
            self._candidates[p] = (cands, space_digest(cands))
        cands, digest = self._candidates[p]
        if digest != item.space:
            raise ValueError(f"item {item.key}: this host's configs for the problem differ from "
                             f"the planning host's (another cutetune version?)")
        return [cands[i] for i in item.indices]

    def to_json(self) -> str:
        return json.dumps({"version": PLAN_VERSION, "work": self.work.to_dict(),
                           "items": [it.to_json() for it in self.items.values()]})

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        d = json.loads(text)
        if d.get("version") != PLAN_VERSION:
            raise ValueError(f"the study's plan has version {d.get('version')}; this cutetune "
                             f"reads version {PLAN_VERSION}")
        items = [WorkItem.from_json(v) for v in d["items"]]
        return cls(Work.from_dict(d["work"]), {it.key: it for it in items})


def plan_items(problems: list[tuple[str, GemmProblem]], work: Work,
               done: set[tuple]) -> list[WorkItem]:
    """Items covering every (problem, config) and cuBLAS baseline not in ``done``; the cuBLAS
    row rides with a problem's first item."""
    items, seen, lacking = [], set(), sample_quota(work.configs, done)
    for suite, p in problems:
        if p in seen:
            continue
        seen.add(p)
        pk, cands = p.key(), work.candidates(p)
        todo = lacking(pk, None, [i for i, c in enumerate(cands)
                                  if measurement_key(pk, "quack", c.short()) not in done])
        cublas = measurement_key(pk, "cublas") not in done
        chunks = [todo[i:i + work.item_size] for i in range(0, len(todo), work.item_size)]
        for j, chunk in enumerate(chunks or ([[]] if cublas else [])):
            items.append(WorkItem(f"{pk}#{j}", suite, p, tuple(chunk), cublas and j == 0,
                                  space_digest(cands)))
    return items
