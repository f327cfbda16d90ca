"""Compile-time heuristics: the cost model's picks frozen into a compact, versioned file, so
Inductor's lowering asks a dict and a log-spaced grid instead of running the model.

A file serves one (arch, dtype). For each operand-major pair and each cell of a log-spaced
(batch, M, N, K) grid it stores the model's top-k configs and its cuBLAS-fallback flag, plus
exact entries for recorded problems (the shapes we know users run), taken from their
measurements where a dataset has them (``measured_picks``). ``lookup`` returns the
exact entry when there is one, else the grid cell nearest in log space: a cell's configs are
the model's picks for the cell's own shape, which is why the grid is log-spaced (tile and wave
effects change with ratios, not differences). A grid without batched cells answers a batched
problem with cuBLAS preferred: it froze nothing for one.

A file may also hold the SwiGLU fusions measured on the GPU (``--swiglu-bench``): per
measured up projection, the fused config that ran it fastest where that beat the unfused
default, else none (``swiglu.fusion_config`` asks it before its rule). And a Triton table
(``--triton-sweep``): the Inductor Triton mm config that predicted mode gives, without
benchmarking, to a host-bound and memory-bound mm, which cutetune leaves to Inductor, and the
launch costs (``--triton-retimed``, ``--triton-steps``) that say which of a graph's such mm
should take them (``models/triton_mm.py``). And the GPU times of ATen, Triton and quack
configs timed together per problem (``--triton-retimed``, ``models/gpu_times.py``): what
decides a GEMM under CUDA graphs.

``cutetune emit --model PATH --out FILE`` writes it; ``Heuristics.load`` reads it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from bisect import bisect_left
from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping

from . import gpu_times as gt
from .gpu_times import GpuTimed
from .triton_mm import TritonTable
from ..artifacts import read_artifact, sealed_json, write_artifact
from ..errors import ArtifactError
from ..space.config import KernelConfig
from ..space.problem import ARCHES, SUPPORTED_DTYPES, GemmProblem, ProblemError
from ..space.rules import violations
from .. import settings

FORMAT = "cutetune-heuristics"
# 2: a checksum of the file's bytes (``cutetune.artifacts``); version 1 files are refused.
VERSION = 2
WHAT = "heuristics file"
MAJORS = ("kk", "kn", "mk", "mn")  # a_major + b_major
CONFIG_FIELDS = tuple(f.name for f in fields(KernelConfig))
# Configs kept per entry: at least the largest top-k the reduced mode may ask for.
FILE_TOP_K = 8
DATA_DIR = settings.PACKAGE_DATA
log = logging.getLogger(__name__)

# An entry: (cuBLAS-fallback flag, indices into the file's config table, best first).
Entry = tuple[bool, tuple[int, ...]]
Pick = tuple[tuple[KernelConfig, ...], bool]  # configs best first, and whether to keep ATen


class HeuristicsError(ArtifactError):
    """A heuristics file that cannot be used (corrupt, another format version, another
    arch/dtype), or a problem it does not cover."""


def _pow2(lo: int, hi: int) -> tuple[int, ...]:
    return tuple(2 ** e for e in range(lo, hi + 1))


@dataclass(frozen=True)
class Grid:
    """Log-spaced cell centres. N and K start at 16 so every cell is TMA-aligned for 16-bit
    operands whichever dim is contiguous; M starts at 1 (decode)."""

    batch: tuple[int, ...] = (1,)
    m: tuple[int, ...] = _pow2(0, 15)  # 1 .. 32768
    n: tuple[int, ...] = _pow2(4, 15)  # 16 .. 32768
    k: tuple[int, ...] = _pow2(4, 15)

    def __post_init__(self) -> None:
        for name in ("batch", "m", "n", "k"):
            v = getattr(self, name)
            if (not v or any(not isinstance(x, int) or x <= 0 for x in v)
                    or list(v) != sorted(set(v))):
                raise HeuristicsError(f"grid {name} must be increasing positive integers, "
                                      f"got {v!r}")

    @property
    def size(self) -> int:
        return len(MAJORS) * len(self.batch) * len(self.m) * len(self.n) * len(self.k)

    def problems(self, arch: str, dtype: str) -> Iterator[GemmProblem | None]:
        """Each cell's problem in storage order; None where the shape is invalid for the
        majors (an m-major A needs M aligned like K)."""
        for majors in MAJORS:
            for b in self.batch:
                for m in self.m:
                    for n in self.n:
                        for k in self.k:
                            try:
                                yield GemmProblem(m, n, k, b, dtype, dtype, majors[0], majors[1],
                                                  arch)
                            except ProblemError:
                                yield None

    def to_json(self) -> dict:
        return {"batch": list(self.batch), "m": list(self.m), "n": list(self.n),
                "k": list(self.k), "majors": list(MAJORS)}

    @cached_property
    def _locate(self) -> tuple["_Locator", ...]:
        return tuple(_Locator(v) for v in (self.batch, self.m, self.n, self.k))

    def _nearest(self, p: GemmProblem) -> tuple[int, ...]:
        return tuple(loc(x) for loc, x in zip(self._locate, (p.batch, p.m, p.n, p.k)))

    def index(self, p: GemmProblem) -> int:
        """Storage index of the cell nearest ``p`` in log space, among its majors' cells."""
        i = MAJORS.index(p.a_major + p.b_major)
        for size, j in zip((len(self.batch), len(self.m), len(self.n), len(self.k)),
                           self._nearest(p)):
            i = i * size + j
        return i

    def froze_batching(self, p: GemmProblem) -> bool:
        """Whether cells of ``p``'s kind, batched or not, hold answers: a grid of unbatched
        cells froze none for a batched problem (its file then prefers cuBLAS there)."""
        return p.batch == 1 or max(self.batch) > 1

    def cell(self, p: GemmProblem) -> GemmProblem | None:
        """The problem of the cell nearest ``p`` (what a file's lookup answers ``p`` with),
        None where that cell's shape is invalid for the majors."""
        b, m, n, k = (v[j] for v, j in zip((self.batch, self.m, self.n, self.k),
                                          self._nearest(p)))
        try:
            return GemmProblem(m, n, k, b, p.dtype, p.dtype, p.a_major, p.b_major, p.arch)
        except ProblemError:
            return None


class _Locator:
    """Nearest grid index in log space, per dimension, by bisection on precomputed logs."""

    def __init__(self, values: tuple[int, ...]) -> None:
        self.logs = [math.log2(v) for v in values]

    def __call__(self, x: int) -> int:
        lx = math.log2(x)
        i = bisect_left(self.logs, lx)
        if i == 0:
            return 0
        if i == len(self.logs):
            return i - 1
        return i if self.logs[i] - lx < lx - self.logs[i - 1] else i - 1


class Heuristics:
    """A loaded heuristics file: ``lookup(problem) -> (top-k configs, use_aten)``."""

    def __init__(self, arch: str, dtype: str, top_k: int, grid: Grid,
                 configs: tuple[KernelConfig, ...], cells: list[Entry | None],
                 exact: dict[str, Entry], meta: dict | None = None, digest: str = "",
                 triton: TritonTable | None = None,
                 swiglu: dict[str, int | None] | None = None,
                 gpu_times: dict[str, GpuTimed] | None = None) -> None:
        self.arch, self.dtype, self.top_k, self.grid = arch, dtype, top_k, grid
        self.configs, self.cells, self.exact = configs, cells, exact
        self.meta = meta or {}
        self.triton = triton
        self.gpu_times = gpu_times or {}  # problem key -> its candidates' GPU times
        self.swiglu = swiglu or {}  # problem key -> index of its fused config, or None
        self.digest = digest or _digest(json.dumps(self.to_json(), sort_keys=True).encode())

    def lookup(self, problem: GemmProblem) -> tuple[tuple[KernelConfig, ...], bool]:
        """The configs to try for ``problem``, best first, and whether the model prefers
        cuBLAS for it. HeuristicsError when the file is for another arch or dtype. A grid of
        unbatched cells froze no answer for a batched problem: its nearest cell's configs are
        candidates to benchmark, and cuBLAS is preferred."""
        exact = self.exact_pick(problem)
        if exact:
            return exact
        configs, aten = self._pick(self.cells[self.grid.index(problem)])
        return configs, aten or not self.grid.froze_batching(problem)

    def exact_pick(self, problem: GemmProblem) -> Pick | None:
        """``lookup``'s answer where the file has an exact entry for ``problem`` (a recorded
        problem, measured where the dataset timed it), else None."""
        self._check(problem)
        entry = self.exact.get(problem.key())
        return None if entry is None else self._pick(entry)

    def _pick(self, entry: Entry | None) -> Pick:
        if entry is None:  # only cells whose shape is invalid for their majors
            return (), True
        aten, idx = entry
        return tuple(self.configs[i] for i in idx), aten

    def swiglu_config(self, problem: GemmProblem) -> tuple[bool, KernelConfig | None]:
        """Whether the GPU measured the SwiGLU fusion of ``problem`` (an up projection), and
        the config to fuse it with (None: the unfused default was faster)."""
        self._check(problem)
        key = problem.key()
        if key not in self.swiglu:
            return False, None
        i = self.swiglu[key]
        return True, None if i is None else self.configs[i]

    def triton_config(self, problem: GemmProblem, measured_only: bool = False
                      ) -> dict[str, int] | None:
        """Inductor's Triton mm kwargs for ``problem`` (a plain mm): the config that ran it
        fastest where the table's retime measured it, else its group's pick (not with
        ``measured_only``); None without either, or without a Triton table in this file."""
        self._check(problem)
        if self.triton is None or problem.batch != 1:
            return None
        return self.triton.config(problem, measured_only)

    def gpu_fastest(self, problem: GemmProblem) -> tuple[str, object] | None:
        """``GpuTimed.fastest`` of ``problem`` where its candidates were timed together,
        else None."""
        self._check(problem)
        timed = self.gpu_times.get(problem.key())
        return None if timed is None else timed.fastest()

    def triton_problems(self, gemms: list[tuple[GemmProblem, dict[str, int]]]
                        ) -> frozenset[GemmProblem]:
        """Which of one graph's host-bound mm problems (each with its ``triton_config``) take
        that Triton config (``models.triton_mm.LaunchCosts``); none without launch costs."""
        for p, _ in gemms:
            self._check(p)
        return self.triton.triton_problems(gemms) if self.triton is not None else frozenset()

    def _check(self, problem: GemmProblem) -> None:
        if problem.arch != self.arch or problem.dtype != self.dtype:
            raise HeuristicsError(f"heuristics are for {self.arch}/{self.dtype}, not "
                                  f"{problem.arch}/{problem.dtype}")

    # ------------------------------------------------------------ file format
    def to_json(self) -> dict:
        enc = lambda e: None if e is None else [int(e[0]), *e[1]]  # noqa: E731
        return {
            "format": FORMAT, "version": VERSION, "arch": self.arch, "dtype": self.dtype,
            "top_k": self.top_k, "config_fields": list(CONFIG_FIELDS),
            "configs": [[getattr(c, f) for f in CONFIG_FIELDS] for c in self.configs],
            "grid": self.grid.to_json(), "cells": [enc(e) for e in self.cells],
            "exact": {k: enc(e) for k, e in sorted(self.exact.items())}, "meta": self.meta,
            **({"triton_mm": self.triton.to_json()} if self.triton is not None else {}),
            **({"swiglu": dict(sorted(self.swiglu.items()))} if self.swiglu else {}),
            **({"gpu_times": {k: gt.to_json(t, self.configs.index)
                              for k, t in sorted(self.gpu_times.items())}}
               if self.gpu_times else {}),
        }

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically, with its checksum: Inductor may read it concurrently."""
        data = sealed_json(self.to_json(), separators=(",", ":"))
        out = write_artifact(path, data, WHAT)
        self.digest = _digest(data)
        return out

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Heuristics":
        """Read a heuristics file, checked (``read_artifact``: format, version, checksum)
        before its content is used, then its content checked as ``_from_json`` says."""
        p = Path(path)
        d, raw = read_artifact(p, FORMAT, "version", VERSION, WHAT,
                               f"write one with `cutetune emit --model MODEL --out {p}`",
                               HeuristicsError)
        try:
            return cls._from_json(d, _digest(raw))
        except HeuristicsError as e:
            raise HeuristicsError(f"{p}: {e}") from None
        except (AttributeError, KeyError, TypeError, ValueError, IndexError) as e:
            raise HeuristicsError(f"corrupt heuristics file {p}: {type(e).__name__}: {e}") from None

    @classmethod
    def _from_json(cls, d: dict, digest: str) -> "Heuristics":
        """The file's content, checked as well as its checksum: a file sealed by another
        writer (or hand-edited and re-sealed) must still hold only configs the rules allow on
        its arch, and entries that fit its table and top-k."""
        if tuple(d["config_fields"]) != CONFIG_FIELDS:
            raise HeuristicsError(f"config fields {d['config_fields']} differ from this "
                                  f"cutetune's {list(CONFIG_FIELDS)} (re-run `cutetune emit`)")
        arch, dtype, top_k = d["arch"], d["dtype"], d["top_k"]
        if arch not in ARCHES or dtype not in SUPPORTED_DTYPES:
            raise HeuristicsError(f"unsupported arch/dtype {arch}/{dtype}")
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
            raise HeuristicsError(f"top_k must be a positive integer, got {top_k!r}")
        g = d["grid"]
        if tuple(g["majors"]) != MAJORS:
            raise HeuristicsError(f"grid majors {g['majors']} differ from {list(MAJORS)}")
        grid = Grid(*(tuple(g[name]) for name in ("batch", "m", "n", "k")))
        if any(len(c) != len(CONFIG_FIELDS) for c in d["configs"]):
            raise HeuristicsError(f"configs need {len(CONFIG_FIELDS)} values each "
                                  f"({', '.join(CONFIG_FIELDS)})")
        configs = tuple(_config(i, c, arch) for i, c in enumerate(d["configs"]))
        n_cfg = len(configs)

        def dec(e) -> Entry | None:
            if e is None:
                return None
            flag, *idx = e
            if (flag not in (0, 1) or len(idx) > top_k
                    or any(not isinstance(i, int) or not 0 <= i < n_cfg for i in idx)):
                raise HeuristicsError(f"bad entry {e!r}")
            return bool(flag), tuple(idx)

        cells = [dec(e) for e in d["cells"]]
        if len(cells) != grid.size:
            raise HeuristicsError(f"{len(cells)} cells for a grid of {grid.size}")
        exact = {str(k): dec(e) for k, e in d["exact"].items()}
        triton = TritonTable.from_json(d["triton_mm"]) if "triton_mm" in d else None
        swiglu = {str(k): v for k, v in d.get("swiglu", {}).items()}
        if any(v is not None and (not isinstance(v, int) or not 0 <= v < n_cfg)
               for v in swiglu.values()):
            raise HeuristicsError("bad SwiGLU entry: not a config index or null")
        gpu = {str(k): gt.from_json(v, configs) for k, v in d.get("gpu_times", {}).items()}
        return cls(arch, dtype, top_k, grid, configs, cells, exact, d.get("meta"),
                   digest, triton, swiglu, gpu)


def _config(i: int, values: list, arch: str) -> KernelConfig:
    """Entry ``i`` of a file's config table, strictly typed and valid on ``arch``."""
    try:
        c = KernelConfig.from_dict(dict(zip(CONFIG_FIELDS, values)), arch)
    except ValueError as e:
        raise HeuristicsError(f"config #{i} {values}: {e}") from None
    bad = violations(c, arch)
    if bad:
        raise HeuristicsError(f"config #{i} ({c.short()}) is not a valid {arch} config: it "
                              f"breaks {', '.join(r.name for r in bad)}")
    return c


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def default_path(arch: str, dtype: str) -> Path:
    """Where the packaged heuristics for (arch, dtype) live (gzipped: a fifth of the bytes)."""
    return DATA_DIR / f"heuristics_{arch}_{dtype}.json.gz"


def model_path(folder: Path, arch: str, dtype: str) -> Path:
    """Where a folder of packaged heuristics keeps the dense cost model of (arch, dtype)."""
    return Path(folder) / settings.model_file_name(arch, dtype)


def device_folder(folder: str | os.PathLike, device: str | None) -> Path | None:
    """The subfolder of ``folder`` (packaged artifacts) holding those measured on ``device``
    (a name ``device_for`` knows, torch's included: cutetune/data/h100_sxm/ for an H100
    SXM), or None where it has none: the arch's own then serve it."""
    from ..space.device import device_for

    try:
        sub = Path(folder) / device_for(device).name.lower() if device else None
    except ValueError:  # a device we have no spec for
        return None
    return sub if sub is not None and sub.is_dir() else None


class PackagedHeuristics:
    """The heuristics shipped in cutetune/data, one file per (arch, dtype), each loaded on
    first use; HeuristicsError from ``lookup`` for a pair that has no file.

    ``lookup`` answers a problem the file has no exact entry for from the cost model packaged
    beside the file (``model_path``; with ``models``), asked at compile time: on held-out
    problems the grid cell's frozen answer loses to the model's own (docs/design.md).
    Without a model for the pair, or one that does not load, the file's grid answers. The
    file keeps everything else: exact entries, the Triton table, SwiGLU fusions, GPU times.

    The folder's files are the arch's (measured on its device, ``device_for(arch)``). A
    device measured apart has a subfolder of its own (``device_folder``) with a file and a
    model per pair it measured: on that device (``device``: its name, or a callable giving
    it, asked at the first ``lookup``, when a compile has the GPU in hand) they answer
    ``lookup``, which config or cuBLAS, since configs rank differently on another Hopper
    (docs/results.md); the arch's file keeps the tables measured only on its device."""

    def __init__(self, folder: Path | None = None, models: bool = True,
                 device: str | Callable[[], str | None] | None = None) -> None:
        folder = DATA_DIR if folder is None else Path(folder)
        self.folder, self.paths = folder, {}
        for path in sorted(folder.glob("heuristics_*_*.json*")):  # .json, or .json.gz
            _, arch, dtype = path.name.split(".json")[0].split("_", 2)
            self.paths[(arch, dtype)] = path
        if not self.paths:
            raise HeuristicsError(
                f"no packaged heuristics in {folder}: write one with `cutetune emit --model "
                f"MODEL --out {default_path('sm90', 'bf16')}` or pass model=PATH")
        self.model_paths = {pair: model_path(folder, *pair) for pair in self.paths
                            if models and model_path(folder, *pair).is_file()}
        self.devices = {sub.name: PackagedHeuristics(sub, models)
                        for sub in sorted(folder.iterdir())
                        if sub.is_dir() and any(sub.glob("heuristics_*_*.json*"))}
        self.digest = _digest("".join(
            [_digest(p.read_bytes()) for p in [*self.paths.values(), *self.model_paths.values()]]
            + [name + h.digest for name, h in self.devices.items()]).encode())
        self._device = device
        self._loaded: dict[tuple[str, str], Heuristics] = {}
        self._models: dict[tuple[str, str], ModelHeuristics | None] = {}

    @cached_property
    def _own(self) -> "PackagedHeuristics | None":
        """The running device's own heuristics (``device_folder``), None where it has none
        or its name cannot be had (the arch's files answer then, as they did before)."""
        try:
            device = self._device() if callable(self._device) else self._device
        except Exception as e:  # noqa: BLE001  (a CUDA error here must not fail a compile)
            log.warning("cutetune: the GPU's name is not known (%s); the arch's heuristics "
                        "answer", e)
            device = None
        sub = device_folder(self.folder, device)
        return self.devices.get(sub.name) if sub is not None else None

    def lookup(self, problem: GemmProblem) -> tuple[tuple[KernelConfig, ...], bool]:
        own = self._own
        if own is not None and (problem.arch, problem.dtype) in own.paths:
            return own.lookup(problem)
        file = self._file(problem)  # an exact entry answers before the model is loaded
        return file.exact_pick(problem) or (self._model(problem) or file).lookup(problem)

    def _model(self, problem: GemmProblem) -> "ModelHeuristics | None":
        """The packaged model of the problem's pair, loaded on first use; None without one."""
        pair = (problem.arch, problem.dtype)
        if pair not in self._models:
            self._models[pair] = None
            if pair in self.model_paths:
                from .artifact import ModelError, load_model

                try:
                    self._models[pair] = ModelHeuristics(load_model(self.model_paths[pair],
                                                                    *pair))
                except (ModelError, ImportError) as e:
                    log.warning("cutetune: the heuristics file's grid answers for %s/%s (%s)",
                                *pair, e)
        return self._models[pair]

    def swiglu_config(self, problem: GemmProblem) -> tuple[bool, KernelConfig | None]:
        return self._file(problem).swiglu_config(problem)

    def triton_config(self, problem: GemmProblem, measured_only: bool = False
                      ) -> dict[str, int] | None:
        return self._file(problem).triton_config(problem, measured_only)

    def gpu_fastest(self, problem: GemmProblem) -> tuple[str, object] | None:
        return self._file(problem).gpu_fastest(problem)

    def triton_problems(self, gemms: list[tuple[GemmProblem, dict[str, int]]]
                        ) -> frozenset[GemmProblem]:
        """Each (arch, dtype)'s GEMMs weighed by its own file's launch costs."""
        by_file: dict[tuple[str, str], list] = {}
        for g in gemms:
            by_file.setdefault((g[0].arch, g[0].dtype), []).append(g)
        return frozenset().union(*(self._file(g[0][0]).triton_problems(g)
                                   for g in by_file.values()))

    def _file(self, problem: GemmProblem) -> Heuristics:
        pair = (problem.arch, problem.dtype)
        h = self._loaded.get(pair)
        if h is None:
            if pair not in self.paths:
                raise HeuristicsError(f"no packaged heuristics for {pair[0]}/{pair[1]}")
            h = self._loaded[pair] = Heuristics.load(self.paths[pair])
        return h


class ModelHeuristics:
    """``lookup`` straight from a cost model (``rank`` and ``prefers_cublas``): what a
    heuristics file freezes, and a way to try a model before emitting one."""

    def __init__(self, model, top_k: int = FILE_TOP_K) -> None:
        self.model, self.top_k = model, top_k
        self.digest = f"model:{type(model).__qualname__}@{id(model):x}"
        self._picks: dict[GemmProblem, Pick] = {}  # a graph asks again (by-M rungs, passes)

    def lookup(self, problem: GemmProblem) -> tuple[tuple[KernelConfig, ...], bool]:
        if problem not in self._picks:
            configs = tuple(c for c, _ in self.model.rank(problem, top_k=self.top_k))
            # the fallback judges the top-1: rank it alone rather than the space again
            self._picks[problem] = configs, (
                not configs or bool(self.model.prefers_cublas(problem, configs[:1])))
        return self._picks[problem]


def build(model, arch: str, dtype: str, top_k: int = FILE_TOP_K, grid: Grid = Grid(),
          problems: Iterable[GemmProblem] = (), meta: dict | None = None,
          progress: Callable[[int], None] | None = None,
          measured: Mapping[str, Pick] | None = None,
          triton: TritonTable | None = None,
          swiglu: Mapping[str, KernelConfig | None] | None = None,
          gpu_times: Mapping[GemmProblem, GpuTimed] | None = None) -> Heuristics:
    """Freeze ``model``'s picks for every grid cell and for each of ``problems`` on
    (arch, dtype) into a Heuristics table; a problem in ``measured`` (by key) gets that pick
    instead of the model's (see ``measured_picks``). ``triton`` rides along as it is, and
    ``swiglu`` (problem key -> fused config or None, ``swiglu.measured_fusions``) and
    ``gpu_times`` (those on (arch, dtype)) too.
    ``progress(1)`` (a bar's ``update``) follows each of the ``grid.size`` cells, then each
    problem."""
    source = ModelHeuristics(model, top_k)
    index: dict[KernelConfig, int] = {}
    measured = measured or {}

    def entry(p: GemmProblem) -> Entry:
        configs, aten = measured.get(p.key()) or source.lookup(p)
        return aten, tuple(index.setdefault(c, len(index)) for c in configs[:top_k])

    step = progress or (lambda n: None)
    cells: list[Entry | None] = []
    for p in grid.problems(arch, dtype):
        cells.append(None if p is None else entry(p))
        step(1)
    exact = {}
    for p in problems:
        if (p.arch, p.dtype) == (arch, dtype):
            exact[p.key()] = entry(p)
        step(1)
    fused = {k: None if c is None else index.setdefault(c, len(index))
             for k, c in (swiglu or {}).items()}
    gpu = {p.key(): t for p, t in (gpu_times or {}).items() if (p.arch, p.dtype) == (arch, dtype)}
    for t in gpu.values():
        if t.quack is not None:
            index.setdefault(t.quack[0], len(index))
    configs = tuple(sorted(index, key=index.__getitem__))
    return Heuristics(arch, dtype, top_k, grid, configs, cells, exact, meta, triton=triton,
                      swiglu=fused, gpu_times=gpu)


# A recorded problem keeps ATen unless its best measured config beat the measured cuBLAS time
# by this fraction: the best of 150+ noisy timings is biased low (repeated timings differ by a
# median 1.5 %, p90 6 %: data/reports/dataset_h200_bf16.md), so a 1 % win is often none.
EXACT_MARGIN = 0.03


def measured_picks(rows: Iterable[Mapping], top_k: int, margin: float = EXACT_MARGIN
                   ) -> dict[str, Pick]:
    """From dataset rows: per problem with a cuBLAS time and ok quack rows, its ``top_k``
    fastest measured configs and whether ATen stays (see EXACT_MARGIN). What was measured
    beats what the model predicts for the shapes users are known to run."""
    from .dataset import CONFIG_COLUMNS

    quack: dict[str, list[tuple[float, KernelConfig]]] = {}
    cublas: dict[str, float] = {}
    for r in rows:
        if r["status"] != "ok" or r["time_ms"] is None:
            continue
        if r["backend"] == "cublas":
            cublas[r["problem_key"]] = r["time_ms"]
        else:
            config = KernelConfig.from_dict({c: r[c] for c in CONFIG_COLUMNS})
            quack.setdefault(r["problem_key"], []).append((r["time_ms"], config))
    picks = {}
    for key, timed in quack.items():
        if key in cublas:
            timed.sort(key=lambda tc: tc[0])
            aten = not timed[0][0] < cublas[key] * (1 - margin)
            picks[key] = (tuple(c for _, c in timed[:top_k]), aten)
    return picks


def predicted_triton_shapes(swept, arch: str, dtype: str) -> list:
    """The swept shapes (``models.triton_mm.SweepShape``) that predicted mode asks a Triton
    table about: on (arch, dtype), host-bound and memory-bound by ``inductor.host_bound``."""
    from ..space.device import device_for
    from .triton_mm import QUACK_LAUNCH_HOST_US, host_bound

    shapes = []
    for s in swept:
        if device_for(s.device).arch != arch or s.dtype != dtype:
            continue
        bound = host_bound(GemmProblem(s.m, s.n, s.k, 1, dtype, dtype, s.majors[0],
                                       s.majors[1], arch), QUACK_LAUNCH_HOST_US)
        if bound is not None and bound[1]:
            shapes.append(s)
    return shapes


def measured_fusions(bench: dict, arch: str, dtype: str) -> dict[str, KernelConfig | None]:
    """From a ``scripts/swiglu_bench.py`` result: per up projection on (arch, dtype), the
    fused config that ran it fastest (ok numerics, quack's kernel not the ATen fallback) where
    that beat the unfused default measured beside it, else None. Chosen and scored on the
    same timings, like the dataset's exact entries."""
    out: dict[str, KernelConfig | None] = {}
    for shape in bench["shapes"]:
        problem = GemmProblem(**shape["problem"])
        if (problem.arch, problem.dtype) != (arch, dtype):
            continue
        ok = [r for r in shape["rows"] if r.get("status") == "ok"]
        unfused = [r["time_ms"] for r in ok if r["variant"] == "cublas+pointwise"]
        fused = sorted((r["time_ms"], KernelConfig.from_dict(r["config"])) for r in ok
                       if r["variant"] == "fused" and r.get("ran_quack"))
        if not unfused:
            continue
        best = fused[0] if fused else None
        out[problem.key()] = best[1] if best and best[0] < unfused[0] else None
    return out
