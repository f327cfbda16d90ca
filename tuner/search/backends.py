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


def _kernel_key(problem: GemmProblem, config: KernelConfig) -> tuple:
    """What a compiled kernel depends on: quack compiles against symbolic shapes, so the
    operand dtypes and majors and the config's compile key, never M/N/K."""
    p = problem
    return (p.arch, p.dtype, p.out_dtype, p.a_major, p.b_major, config.compile_key())


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
    """

    def __init__(self, data: pa.Table | str | os.PathLike, backend: str = "quack"):
        table = data if isinstance(data, pa.Table) else load(data)
        table = table.filter(pc.equal(table.column("backend"), backend))
        if table.num_rows == 0:
            raise ReplayError(f"the dataset has no {backend!r} rows to replay")
        rows = table.select(["problem_key", "timestamp", "status", "time_ms", "compile_s",
                             "n_reps", *PROBLEM_COLUMNS, *CONFIG_COLUMNS]).to_pylist()
        rows.sort(key=lambda r: r["timestamp"] or 0.0)
        self._problems: dict[str, GemmProblem] = {}
        self._rows: dict[str, dict[KernelConfig, RecordedRow]] = {}
        self._compile_s: dict[tuple, float] = {}
        for r in rows:
            pk = r["problem_key"]
            if pk not in self._problems:
                self._problems[pk] = problem_of(r)
            config = KernelConfig.from_dict({c: r[c] for c in CONFIG_COLUMNS})
            compile_s = float(r["compile_s"] or 0.0)
            self._rows.setdefault(pk, {})[config] = RecordedRow(
                r["status"], r["time_ms"] if r["status"] == "ok" else None, compile_s,
                int(r["n_reps"] or DEFAULT_REPS))
            kk = _kernel_key(self._problems[pk], config)
            self._compile_s[kk] = max(self._compile_s.get(kk, 0.0), compile_s)
        self._built: set[tuple] = set()

    def fresh(self) -> "ReplayBackend":
        """The same records with no kernel built yet: the start of another tuning run."""
        other = copy.copy(self)
        other._built = set()
        return other

    def problems(self) -> list[GemmProblem]:
        return list(self._problems.values())

    def configs(self, problem: GemmProblem) -> list[KernelConfig]:
        """Configs recorded for ``problem`` (any status)."""
        return list(self._rows.get(problem.key(), {}))

    def recorded(self, problem: GemmProblem, config: KernelConfig) -> RecordedRow:
        try:
            return self._rows[problem.key()][config]
        except KeyError:
            what = "problem" if problem.key() not in self._rows else f"config {config.short()}"
            raise ReplayError(f"{what} not recorded for {problem.key()} in the replayed "
                              f"dataset") from None

    def compile_cost(self, problem: GemmProblem, config: KernelConfig) -> float:
        """Cold build time of the kernel behind ``config`` (see the class docstring)."""
        return self._compile_s[_kernel_key(problem, config)]

    def bench_cost(self, rec: RecordedRow) -> float:
        return BENCH_OVERHEAD_S + (rec.time_ms or 0.0) * rec.n_reps / 1e3

    def measure(self, problem: GemmProblem, configs: list[KernelConfig]) -> list[Measurement]:
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
