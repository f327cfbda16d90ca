"""A GEMM's candidates timed on the GPU in the same rounds, for decisions by GPU time alone.

Under CUDA graphs a replay launches nothing from the host, so the kernel that runs a GEMM
fastest on the GPU runs the step fastest: no host cost to weigh. The candidates are those a
user's other modes would run: ATen (cuBLAS), Inductor's Triton mm template configs (the ones
max-autotune weighs) and quack's configs. scripts/triton_mm_retime.py times them L2-cold,
interleaved in rounds (tuner.measure's method); one retimed row of a problem gives its
``GpuTimed``. Only candidates timed in the same rounds are compared: times from separate runs
differ by more than the small-M GEMMs' candidates do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable

from ..space.config import KernelConfig
from ..space.device import device_for
from ..space.problem import GemmProblem
from ..space.rules import is_valid
from .triton_mm import CONFIG_KEYS, QUACK_CONFIG, ConfigKey, _read_rows, _timed, config_key


@dataclass(frozen=True)
class GpuTimed:
    """One problem's GPU times in us, timed together: ATen's, and the fastest Triton config's
    and quack config's where they were timed."""

    aten_us: float
    triton: tuple[ConfigKey, float] | None = None
    quack: tuple[KernelConfig, float] | None = None

    def fastest(self) -> tuple[str, ConfigKey | KernelConfig | None]:
        """("aten", None), ("triton", its ConfigKey) or ("quack", its KernelConfig): the
        candidate that ran fastest (a tie keeps ATen, then Triton)."""
        best = ("aten", None, self.aten_us)
        for kind, timed in (("triton", self.triton), ("quack", self.quack)):
            if timed is not None and timed[1] < best[2]:
                best = (kind, *timed)
        return best[0], best[1]


def _fastest(variants: Iterable[tuple[object, float]]) -> tuple | None:
    return min(variants, key=lambda cv: cv[1], default=None)


def retimed_gpu_times(path: str | os.PathLike) -> list[tuple[GemmProblem, GpuTimed]]:
    """Each row of a retime file (scripts/triton_mm_retime.py, JSON lines) that timed ATen:
    its problem and GpuTimed. Variants without a time are skipped, and quack configs the rules
    reject for the problem. ValueError names the file and line of a corrupt row."""
    def parse(row: dict) -> tuple[GemmProblem, GpuTimed] | None:
        timed = {k: v for k, v in row.get("timed", {}).items() if _timed(float(v["ms"]))}
        if "aten" not in timed:
            return None
        majors = str(row["majors"])
        problem = GemmProblem(int(row["m"]), int(row["n"]), int(row["k"]), 1, str(row["dtype"]),
                              str(row["dtype"]), majors[0], majors[1],
                              device_for(str(row["device"])).arch)
        triton = [(config_key(t["config"]), float(t["ms"]) * 1e3)
                  for name, t in timed.items() if name != "aten" and QUACK_CONFIG not in t]
        quack = [(KernelConfig.from_dict(t[QUACK_CONFIG], problem.arch), float(t["ms"]) * 1e3)
                 for t in timed.values() if QUACK_CONFIG in t]
        quack = [(c, us) for c, us in quack if is_valid(c, problem.arch, problem)]
        return problem, GpuTimed(float(timed["aten"]["ms"]) * 1e3, _fastest(triton),
                                 _fastest(quack))

    return _read_rows(path, "retime", parse)


def to_json(timed: GpuTimed, config_index) -> list:
    """[aten_us, Triton config or None, its us or None, quack config index or None, its us or
    None]; ``config_index(KernelConfig)`` files the quack config in the heuristics' table."""
    t, q = timed.triton, timed.quack
    return [timed.aten_us, list(t[0]) if t else None, t[1] if t else None,
            config_index(q[0]) if q else None, q[1] if q else None]


def from_json(v: list, configs: tuple[KernelConfig, ...]) -> GpuTimed:
    """ValueError when the entry is malformed or its times are not positive."""
    aten_us, triton, triton_us, quack, quack_us = v
    if triton is not None and len(triton) != len(CONFIG_KEYS):
        raise ValueError(f"Triton config {triton} needs {len(CONFIG_KEYS)} values")
    if quack is not None and not (isinstance(quack, int) and 0 <= quack < len(configs)):
        raise ValueError(f"quack config index {quack!r} is not in the file's {len(configs)} "
                         f"configs")
    out = GpuTimed(float(aten_us),
                   None if triton is None else (tuple(int(x) for x in triton), float(triton_us)),
                   None if quack is None else (configs[int(quack)], float(quack_us)))
    times = [out.aten_us] + [x[1] for x in (out.triton, out.quack) if x is not None]
    if not all(_timed(t) for t in times):
        raise ValueError(f"GPU times {times} are not all positive")
    return out
