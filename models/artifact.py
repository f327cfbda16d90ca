"""The trained cost model as one versioned JSON file, and the object that answers queries.

The file holds the XGBoost boosters (UBJ, deflated, base64) next to what is needed to trust
them: the kind of problem it ranks (``kinds``: dense or grouped GEMMs; a file without one is a
dense model, as every file was before grouped models), arch, dtype and device, the feature
schema (the kind's feature names at training time), package versions, the sha256 of the
training data and the held-out metrics. Loading checks all of it against this installation
and the request, and names the file and the mismatch instead of mis-predicting. A model of one
kind refuses to rank a problem of the other: each kind has its own file
(``shipped_model_path``).

A file may also keep the model's own picks for the problems a compile will ask about
(``CostModel.with_picks``; the shipped grouped model's, for the MoE shapes), which
``read_picks`` returns without loading a booster, so that a compile asking only for those
needs neither the boosters nor XGBoost.

Since format version 2 the file carries a checksum of all its bytes (``cutetune.artifacts``),
checked before XGBoost sees a booster: XGBoost's loader trusts its input, and a changed
character inside a booster could crash the process or silently change predictions. Version 1
files have no checksum: reading one would be that risk, so they are refused (retrain).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

import numpy as np

from .. import settings
from ..artifacts import read_artifact, sealed_json, write_artifact
from ..errors import ArtifactError
from ..space.config import KernelConfig
from ..space.device import DeviceSpec, device_for
from ..space.problem import GemmProblem, GroupedProblem, ProblemError, layout_name
from ..space.rules import family_of, violations

from .fallback import CublasFallback, fallback_inputs
from .features import ConfigTable, arch_config_table, problem_descriptors
from .kinds import ProblemKind, kind_named, kind_of
from .learners import BoosterModel, blended

FORMAT = "cutetune-cost-model"
FORMAT_VERSION = 3
READABLE_VERSIONS = (2, 3)  # 3 deflates the boosters; 2 is otherwise the same
WHAT = "cost model"
RETRAIN = "retrain it with `cutetune train`"


class ModelError(ArtifactError):
    """A model file that cannot be used: missing, corrupt, or made for something else."""


def shipped_model_path(arch: str = "sm90", dtype: str = "bf16", kind: str = "dense",
                       device: str | None = None) -> Path:
    """Where the packaged model of ``kind`` problems on ``arch``/``dtype`` is (or would be):
    ``device``'s own where it was measured apart and has one (``heuristics.device_folder``),
    else the arch's."""
    from .heuristics import device_folder

    name = settings.model_file_name(arch, dtype, kind_named(kind).name)
    data = Path(str(resources.files("cutetune") / "data"))
    own = device_folder(data, device)
    return own / name if own is not None and (own / name).is_file() else data / name


@dataclass
class CostModel:
    """Ranks kernel configs of a problem by predicted time.

    ``ranker`` orders configs; ``timer`` predicts log times (ms) and is the ranker itself
    when the ranker is a regression. ``fallback`` (optional) says when ATen (cuBLAS, or
    torch._grouped_mm for grouped GEMMs) is the safer bet. The boosters' kind is the model's.
    ``timer_weight`` > 0 orders by the ranker's score plus that weight times the time model's
    log time (``methods.blend_method``); the time model then scores every config.
    """

    arch: str
    dtype: str
    device: DeviceSpec
    ranker: BoosterModel
    timer: BoosterModel
    fallback: CublasFallback | None = None
    metadata: dict = field(default_factory=dict)
    timer_weight: float = 0.0
    # problem key -> ``picks``'s answer (None: ATen), computed when the file was written for
    # the problems a compile will ask about (``with_picks``); ``read_picks`` reads them alone
    known_picks: dict[str, KernelConfig | None] = field(default_factory=dict, repr=False)
    _spaces: dict[str, ConfigTable] = field(default_factory=dict, repr=False)  # by family

    def __post_init__(self) -> None:
        if self.ranker.kind != self.timer.kind:
            raise ValueError(f"the ranker reads {self.ranker.kind} problems' features, the time "
                             f"model {self.timer.kind} ones'")
        if not (np.isfinite(self.timer_weight) and self.timer_weight >= 0.0):
            raise ValueError(f"timer weight must be finite and >= 0, got {self.timer_weight}")
        if self.timer_weight and self.timer is self.ranker:
            raise ValueError("a timer weight blends a ranking objective with the time model; "
                             "this model's ranker is the time model")

    @property
    def ordering(self) -> str:
        """What orders the configs: the ranker's objective, blended with the time model's."""
        if not self.timer_weight:
            return self.ranker.objective
        return f"{self.ranker.objective}+{self.timer_weight:g}*regression"

    @property
    def kind(self) -> ProblemKind:
        """The kind of problem the model ranks."""
        return kind_named(self.ranker.kind)

    def measured_layout(self, problem: GemmProblem | GroupedProblem) -> bool:
        """Whether the model's dataset measured problems of ``problem``'s layout
        (``layout_name``: the operands' majors, and whether batched). Elsewhere its fallback
        extrapolates, and predicted mode runs ATen. An older file, which kept no layouts,
        answers True."""
        layouts = self.metadata.get("trained_on", {}).get("layouts")
        return layouts is None or layout_name(problem) in layouts

    def _check(self, problem: GemmProblem | GroupedProblem) -> None:
        kind = kind_of(problem)
        if kind is not self.kind:
            raise ProblemError(f"this cost model ranks {self.kind.name} GEMMs; {problem.key()} is "
                               f"a {kind.name} one (its model is a file of its own)")
        if (problem.arch, problem.dtype) != (self.arch, self.dtype):
            raise ProblemError(f"this cost model is for {self.arch}/{self.dtype}; the problem is "
                               f"{problem.arch}/{problem.dtype}")

    def _table(self, problem, configs) -> tuple[ConfigTable, np.ndarray | None]:
        """The configs to score and a row mask: all valid ones of the problem's config family
        on the arch when ``configs`` is None; else ``configs`` as given, each checked valid for
        the problem."""
        if configs is None:
            family = family_of(problem)
            if family not in self._spaces:
                self._spaces[family] = arch_config_table(self.arch, family)
            space = self._spaces[family]
            return space, space.valid_mask(problem)
        configs = list(configs)
        if not configs:
            raise ValueError("no configs to rank")
        for c in configs:
            bad = violations(c, self.arch, problem)
            if bad:
                raise ValueError(f"config {c.short()} is invalid for {problem.key()}: "
                                 f"{bad[0].name}: {bad[0].why}")
        return ConfigTable.of(configs), None

    def predict_log_time(self, problem, configs) -> np.ndarray:
        """Predicted natural log of the time in ms of each config on ``problem``."""
        self._check(problem)
        table, mask = self._table(problem, configs)
        return self.timer.predict(table.features(problem, self.device, mask))

    def rank(self, problem, configs=None, top_k: int | None = None
             ) -> list[tuple[KernelConfig, float]]:
        """(config, predicted ms), in the ranker's order; all valid configs when None. The ms
        come from the time model, so with a ranking objective they need not be monotone
        (``scored`` gives the ranker's own score beside them)."""
        return [(c, ms) for c, _, ms in self.scored(problem, configs, top_k)]

    def scored(self, problem, configs=None, top_k: int | None = None
               ) -> list[tuple[KernelConfig, float, float]]:
        """(config, ranker score, predicted ms), best first: the order is the ranker's score's
        (lower is better; the predicted log ms when the ranker is the time model)."""
        self._check(problem)
        table, mask = self._table(problem, configs)
        X = table.features(problem, self.device, mask)
        score, all_log_ms = self._scores(X)
        order = np.argsort(score, kind="stable")[:top_k]
        log_ms = all_log_ms[order] if all_log_ms is not None else self.timer.predict(X[order])
        rows = order if mask is None else np.flatnonzero(mask)[order]
        return list(zip(map(table.configs.__getitem__, rows.tolist()), score[order].tolist(),
                        np.exp(log_ms).tolist()))

    def _scores(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The ranking score of each row, and its predicted log ms where that came with it."""
        score = self.ranker.predict(X)
        if self.timer_weight:
            log_ms = self.timer.predict(X)
            return blended(score, log_ms, self.timer_weight), log_ms
        return score, score if self.timer is self.ranker else None

    def picks(self, problems) -> list[KernelConfig | None]:
        """Predicted mode's answer for each problem: its top-1 among the valid configs, or None
        where ``prefers_aten``; one prediction per booster for them all (a compile
        asks this for every rung of a dynamic size)."""
        problems = list(problems)
        if not problems:
            return []
        blocks = []
        for problem in problems:
            self._check(problem)
            table, mask = self._table(problem, None)
            rows = np.arange(len(table.configs)) if mask is None else np.flatnonzero(mask)
            if not len(rows):
                raise ValueError(f"no valid config for {problem.key()}")
            blocks.append((table, rows, table.features(problem, self.device, mask)))
        X = np.concatenate([x for _, _, x in blocks])
        score, log_ms = self._scores(X)
        starts = np.cumsum([0] + [len(x) for _, _, x in blocks[:-1]])
        best = np.array([s + int(np.argmin(score[s:s + len(x)]))
                         for s, (_, _, x) in zip(starts, blocks)])
        best_log_ms = log_ms[best] if log_ms is not None else self.timer.predict(X[best])
        aten = self._prefers_aten(problems, np.exp(best_log_ms))
        return [None if a else table.configs[rows[i - s]]
                for (table, rows, _), s, i, a in zip(blocks, starts, best, aten)]

    def with_picks(self, problems) -> "CostModel":
        """This model with ``picks`` of ``problems`` kept, to be written into its file."""
        problems = list(problems)
        return replace(self, known_picks=dict(zip((p.key() for p in problems),
                                                  self.picks(problems))))

    def aten_margin(self, problem, configs=None, top1_ms: float | None = None) -> float:
        """The fallback's quantile of log(t_top1 / t_ATen), top-1 among ``configs`` (None: the
        valid space), ATen being the kind's baseline (cuBLAS, or torch._grouped_mm): below 0
        means the model is that confident its pick beats ATen. ``top1_ms``: the top-1's
        predicted ms, where the caller has ranked already."""
        return float(self.aten_margins([problem], [self._top1_ms(problem, configs, top1_ms)])[0])

    def _top1_ms(self, problem, configs, top1_ms: float | None) -> float:
        """``top1_ms``, or where the caller has not ranked, the top-1's predicted ms."""
        if top1_ms is None:
            (_, top1_ms), = self.rank(problem, configs, top_k=1)
        return top1_ms

    def aten_margins(self, problems, top1_ms) -> np.ndarray:
        """``aten_margin`` of each problem given its top-1's predicted ms, in one prediction."""
        if self.fallback is None:
            raise ModelError(f"this cost model was trained without {self.kind.baseline} "
                             f"timings: no fallback")
        x = fallback_inputs(problem_descriptors(list(problems), self.device), np.log(top1_ms))
        return np.asarray(self.fallback.predict(x), np.float64)

    def prefers_aten(self, problem, configs=None, top1_ms: float | None = None) -> bool:
        """Whether predicted mode should run ATen instead of the model's top-1: where the
        fallback expects ATen to win, or the model's dataset never measured the problem's
        layout."""
        return bool(self._prefers_aten([problem], [self._top1_ms(problem, configs, top1_ms)])[0])

    def _prefers_aten(self, problems, top1_ms) -> np.ndarray:
        """``prefers_aten`` of each problem given its top-1's predicted ms."""
        return ((self.aten_margins(problems, top1_ms) > 0.0)
                | ~np.array([self.measured_layout(p) for p in problems]))

    def prefers_cublas(self, problem: GemmProblem, configs=None) -> bool:
        """``prefers_aten`` of a dense GEMM (ATen's mm runs cuBLAS): what Inductor's
        integration and the heuristics ask a dense model."""
        if not isinstance(problem, GemmProblem):
            raise ProblemError(f"cuBLAS runs dense GEMMs; {problem.key()} is "
                               f"{kind_of(problem).name}: ask prefers_aten")
        return self.prefers_aten(problem, configs)

    # ------------------------------------------------------------ file format
    def to_dict(self) -> dict:
        d = {"format": FORMAT, "format_version": FORMAT_VERSION, "kind": self.kind.name,
             "arch": self.arch, "dtype": self.dtype, "device": self.device.name,
             "feature_names": list(self.kind.feature_names), "metadata": self.metadata,
             "ranker": self.ranker.to_dict()}
        if self.timer is not self.ranker:
            d["timer"] = self.timer.to_dict()
        if self.timer_weight:
            d["timer_weight"] = self.timer_weight
        if self.fallback is not None:
            d["fallback"] = self.fallback.to_dict()
        if self.known_picks:  # each config once, each problem its index (None: ATen)
            configs = list(dict.fromkeys(c for c in self.known_picks.values() if c is not None))
            index = {c: i for i, c in enumerate(configs)}
            d["picks"] = {"configs": [c.to_dict() for c in configs],
                          "by_problem": {k: None if c is None else index[c]
                                         for k, c in sorted(self.known_picks.items())}}
        return d

    def save(self, path: str | os.PathLike) -> Path:
        """Write the model file, with its checksum, atomically (gzipped where ``path`` ends
        in .gz, as ``load_model`` reads it)."""
        return write_artifact(path, sealed_json(self.to_dict(), indent=1, sort_keys=True), WHAT)


def load_model(path: str | os.PathLike | None = None, arch: str = "sm90",
               dtype: str = "bf16", kind: str = "dense") -> CostModel:
    """Load a model file of ``kind`` problems (None: the one shipped for ``arch``/``dtype``),
    checked against this installation; ModelError names the file and what is wrong with it."""
    path, d = _read(path, arch, dtype, kind)
    try:
        ranker = BoosterModel.from_dict(d["ranker"])
        timer = BoosterModel.from_dict(d["timer"]) if "timer" in d else ranker
        fallback = CublasFallback.from_dict(d["fallback"]) if "fallback" in d else None
        device = device_for(d["device"])
        model = CostModel(arch, dtype, device, ranker, timer, fallback, d.get("metadata", {}),
                          float(d.get("timer_weight", 0.0)),  # absent: no blend
                          _picks(d, arch))
    except Exception as e:  # noqa: BLE001  (checksummed, yet not what this cutetune writes)
        raise ModelError(f"cost model {path} is damaged: {type(e).__name__}: {e}") from None
    if model.kind.name != kind:
        raise ModelError(f"cost model {path} is damaged: it says it ranks {kind} GEMMs, its "
                         f"boosters read {model.kind.name} GEMMs' features")
    if not timer.predicts_time:
        raise ModelError(f"cost model {path} has no time model (timer objective "
                         f"{timer.objective!r})")
    return model


def read_picks(path: str | os.PathLike | None = None, arch: str = "sm90", dtype: str = "bf16",
               kind: str = "dense") -> dict[str, KernelConfig | None]:
    """The picks a model file keeps (``CostModel.with_picks``), checked as ``load_model``
    checks the file but read without its boosters (nor XGBoost): what a compile asks first."""
    path, d = _read(path, arch, dtype, kind)
    try:
        return _picks(d, arch)
    except Exception as e:  # noqa: BLE001  (checksummed, yet not what this cutetune writes)
        raise ModelError(f"cost model {path} is damaged: {type(e).__name__}: {e}") from None


def _picks(d: dict, arch: str) -> dict[str, KernelConfig | None]:
    """The file's picks that this cutetune's rules still allow (a config the rules now reject
    is left for the model to replace)."""
    kept = d.get("picks", {})
    configs = [KernelConfig.from_dict(c, arch) for c in kept.get("configs", [])]
    picks = {k: None if i is None else configs[i] for k, i in kept.get("by_problem", {}).items()}
    problem = GroupedProblem.from_key if d.get("kind") == "grouped" else GemmProblem.from_key
    return {k: c for k, c in picks.items() if c is None or not violations(c, arch, problem(k))}


def _read(path, arch: str, dtype: str, kind: str) -> tuple[Path, dict]:
    """A model file's path and contents, checked against the request and this installation."""
    shipped = shipped_model_path(arch, dtype, kind)
    path = Path(path) if path is not None else shipped
    if not path.exists():
        hint = ""
        if path == shipped:
            what = "" if kind == "dense" else f"{kind} "
            data = "" if kind == "dense" else f" on a dataset of {kind} measurements"
            hint = (f" (no {what}model is shipped for {arch}/{dtype} yet: train one with "
                    f"`cutetune train`{data})")
        raise ModelError(f"cost model file {path} does not exist{hint}")
    d, _ = read_artifact(path, FORMAT, "format_version", READABLE_VERSIONS, WHAT, RETRAIN,
                         ModelError)
    theirs = d.get("kind", "dense")  # a file from before grouped models ranks dense GEMMs
    if theirs != kind:
        raise ModelError(f"cost model {path} ranks {theirs} GEMMs, not the requested {kind} ones")
    if (d.get("arch"), d.get("dtype")) != (arch, dtype):
        raise ModelError(f"cost model {path} is for {d.get('arch')}/{d.get('dtype')}, "
                         f"not the requested {arch}/{dtype}")
    names = list(kind_named(kind).feature_names)
    if d.get("feature_names") != names:
        theirs, ours = d.get("feature_names") or [], names
        diff = sorted(set(theirs) ^ set(ours)) or ["(same names, different order)"]
        raise ModelError(f"cost model {path} was trained on another feature schema than this "
                         f"cutetune computes (differs in: {', '.join(map(str, diff[:8]))}); "
                         f"retrain it with `cutetune train`")
    return path, d
