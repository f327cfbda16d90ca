"""Where the tuner's measurements come from: the GPU, or a recorded dataset replayed on the CPU.

Both answer ``measure(problem, configs)`` with one Measurement per config and charge what the
measurement cost: ``compile_s`` for building the kernel (paid once per compile key, since
configs that share one share the compiled kernel) and ``bench_s`` for timing it. The tuner's
budgets and the replay benchmark's wall-time axis add up these charges, so a replayed search
is costed like the same search on the GPU.
"""

from __future__ import annotations

import copy
import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ...models.dataset import CONFIG_COLUMNS, PROBLEM_COLUMNS, load, problem_of
from ...space.config import KernelConfig
from ...space.problem import GemmProblem

# Cost of one measurement besides its timed launches (kernel load, numerics check, warm-up,
# synchronization), charged to replayed measurements. The collector's GPU worker spent 4-11 ms
# per measurement, timed launches included (gpu_busy_fraction * elapsed_s / measured in
# data/reports/collect_stats/run{2,3}_*.json); a tuning loop that measures one config per call
# pays at least that, so this is a low estimate.
BENCH_OVERHEAD_S = 0.01
# Timed repetitions assumed for a recorded row without n_reps (tuner/measure.py's max_reps).
DEFAULT_REPS = 30


@dataclass(frozen=True)
class Measurement:
    """One config's outcome and what measuring it cost.

    compile_s is the compile time charged to this measurement: zero when an earlier
    measurement already built its kernel. time_ms is None unless status is "ok". row is the
    dataset row behind it (for appending GPU results; replay leaves it out).
    """

    config: KernelConfig
    status: str
    time_ms: float | None
    compile_s: float
    bench_s: float
    row: Mapping | None = field(default=None, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.time_ms is not None and math.isfinite(self.time_ms)


class BenchmarkBackend(Protocol):
    def measure(self, problem: GemmProblem, configs: list[KernelConfig]) -> list[Measurement]: ...


class ReplayError(KeyError):
    """A config or problem the replayed dataset did not record."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0])


# What a compiled kernel depends on besides the config's compile key: quack compiles against
# symbolic shapes, so the operand dtypes and majors, never M/N/K.
_KERNEL_FIELDS = ("arch", "dtype", "out_dtype", "a_major", "b_major")


def _kernel_key(problem: GemmProblem, config: KernelConfig) -> tuple:
    return (*(getattr(problem, f) for f in _KERNEL_FIELDS), config.compile_key())


@dataclass(frozen=True)
class RecordedRow:
    status: str
    time_ms: float | None
    compile_s: float
    n_reps: int


class ReplayBackend:
    """Answers from recorded measurements, exactly as recorded.

    A config measured more than once answers with its latest row. A kernel's compile cost is
    the largest compile_s recorded for its compile key with the problem's dtypes and majors:
    quack's kernel cache makes every build after the first nearly free, so the maximum is the
    cold build a fresh tuning run pays. Benchmark cost is the recorded time times the
    recorded repetitions plus BENCH_OVERHEAD_S (an estimate). Each instance remembers the
    kernels it has built; ``fresh()`` starts another tuning run on the same records.
    ``delay_s``: wall seconds each ``measure`` call sleeps, standing in for the GPU's time
    (to watch several processes share a study, or to interrupt one mid-measurement).
    """

    def __init__(self, data: pa.Table | str | os.PathLike, backend: str = "quack",
                 delay_s: float = 0.0):
        self.delay_s = delay_s
        table = data if isinstance(data, pa.Table) else load(data)
        table = table.filter(pc.equal(table.column("backend"), backend))
        if table.num_rows == 0:
            raise ReplayError(f"the dataset has no {backend!r} rows to replay")
        table = table.select(["problem_key", "timestamp", "status", "time_ms", "compile_s",
                              "n_reps", *PROBLEM_COLUMNS, *CONFIG_COLUMNS])
        # oldest first (no timestamp counts as 0), stable: a later row of a config wins
        table = table.take(pc.sort_indices(pc.fill_null(table.column("timestamp"), 0.0)))
        # A problem's rows become RecordedRows when it is first asked for: a tuning run asks
        # for one problem of the hundreds a dataset holds.
        self._table = table
        self._where: dict[str, list[int]] = {}
        for i, pk in enumerate(table.column("problem_key").to_pylist()):
            self._where.setdefault(pk, []).append(i)
        firsts = table.take([idx[0] for idx in self._where.values()]).to_pylist()
        self._problems = {r["problem_key"]: problem_of(r) for r in firsts}
        self._rows: dict[str, dict[KernelConfig, RecordedRow]] = {}
        self._compile_s: dict[tuple, float] = {}
        kernels = table.group_by([*_KERNEL_FIELDS, *CONFIG_COLUMNS]).aggregate(
            [("compile_s", "max")])
        for r in kernels.to_pylist():
            config = KernelConfig.from_dict({c: r[c] for c in CONFIG_COLUMNS})
            kk = (*(r[f] for f in _KERNEL_FIELDS), config.compile_key())
            self._compile_s[kk] = max(self._compile_s.get(kk, 0.0),
                                      float(r["compile_s_max"] or 0.0))
        self._built: set[tuple] = set()

    def _problem_rows(self, pk: str) -> dict[KernelConfig, RecordedRow]:
        if pk not in self._rows and pk in self._where:
            rows = {}
            for r in self._table.take(self._where[pk]).to_pylist():
                config = KernelConfig.from_dict({c: r[c] for c in CONFIG_COLUMNS})
                rows[config] = RecordedRow(r["status"], r["time_ms"] if r["status"] == "ok"
                                           else None, float(r["compile_s"] or 0.0),
                                           int(r["n_reps"] or DEFAULT_REPS))
            self._rows[pk] = rows
        return self._rows.get(pk, {})

    def fresh(self) -> "ReplayBackend":
        """The same records with no kernel built yet: the start of another tuning run."""
        other = copy.copy(self)
        other._built = set()
        return other

    def problems(self) -> list[GemmProblem]:
        return list(self._problems.values())

    def configs(self, problem: GemmProblem) -> list[KernelConfig]:
        """Configs recorded for ``problem`` (any status)."""
        return list(self._problem_rows(problem.key()))

    def recorded(self, problem: GemmProblem, config: KernelConfig) -> RecordedRow:
        try:
            return self._problem_rows(problem.key())[config]
        except KeyError:
            what = "problem" if problem.key() not in self._where else f"config {config.short()}"
            raise ReplayError(f"{what} not recorded for {problem.key()} in the replayed "
                              f"dataset") from None

    def compile_cost(self, problem: GemmProblem, config: KernelConfig) -> float:
        """Cold build time of the kernel behind ``config`` (see the class docstring)."""
        return self._compile_s[_kernel_key(problem, config)]

    def bench_cost(self, rec: RecordedRow) -> float:
        return BENCH_OVERHEAD_S + (rec.time_ms or 0.0) * rec.n_reps / 1e3

    def measure(self, problem: GemmProblem, configs: list[KernelConfig]) -> list[Measurement]:
        if self.delay_s:
            time.sleep(self.delay_s)
        out = []
        for config in configs:
            rec = self.recorded(problem, config)
            kk = _kernel_key(problem, config)
            compile_s = 0.0 if kk in self._built else self._compile_s[kk]
            self._built.add(kk)
            out.append(Measurement(config, rec.status, rec.time_ms, compile_s,
                                   self.bench_cost(rec)))
        return out


MeasureFn = Callable[[GemmProblem, Sequence[KernelConfig]], list[dict]]


class GpuBackend:
    """Adapter from a GPU harness that returns dataset rows to the backend protocol.

    ``measure_fn(problem, configs)`` returns one dataset row per config (status, time_ms,
    compile_s, ...), as tuner/measure.py records them. compile_s comes from the row; the
    call's remaining wall time is split evenly over its configs as their bench_s.
    """

    def __init__(self, measure_fn: MeasureFn):
        self.measure_fn = measure_fn

    def measure(self, problem: GemmProblem, configs: list[KernelConfig]) -> list[Measurement]:
        t0 = time.perf_counter()
        rows = self.measure_fn(problem, list(configs))
        elapsed = time.perf_counter() - t0
        by_key = {r["config_key"]: r for r in rows if r.get("backend", "quack") == "quack"}
        missing = [c.short() for c in configs if c.short() not in by_key]
        if missing:
            raise RuntimeError(f"the GPU harness returned no row for {', '.join(missing)}")
        compile_total = sum(float(by_key[c.short()].get("compile_s") or 0.0) for c in configs)
        bench_each = max(elapsed - compile_total, 0.0) / max(len(configs), 1)
        out = []
        for c in configs:
            r = by_key[c.short()]
            ok = r["status"] == "ok"
            out.append(Measurement(c, r["status"], r.get("time_ms") if ok else None,
                                   float(r.get("compile_s") or 0.0), bench_each, row=r))
        return out
