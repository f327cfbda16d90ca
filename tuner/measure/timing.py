"""GPU measurement of one problem against a list of configs (and cuBLAS), run inside a worker
process so that a kernel that aborts or hangs takes down only that worker.

Method (per problem, per backend):
- L2-cold: the inputs rotate over enough (A, B, D) sets to span at least 3x the L2, so each
  timed launch reads operands that are not in L2.
- Numerics first: D is poisoned with NaN, one launch, relative Frobenius error against an
  fp32 reference; NaN or error above the dtype's bound marks the config wrong_result.
- Warm-up launches, then ``reps`` timed launches, each between its own pair of CUDA events.
  A GPU sleep queued ahead of them lets the host enqueue every launch before the GPU starts,
  so the events time the kernel, not the host's launch latency. Median, p20 and p80 are kept.
- A measurement whose repeats disagree (p80 - p20 above ``UNSTABLE_SPREAD`` of the median) is
  timed again, up to ``policy.retimes`` more times, and the tightest try is kept: one bimodal
  row can make its config the model's worst pick (docs/results.md).
- Inputs are random normal values (never zeros, which run faster and hide unwritten output).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

import numpy as np

from ...artifacts import environment
from ...errors import CutetuneError
from ...space.config import KernelConfig
from ...space.problem import DTYPE_BYTES, GemmProblem

REL_ERR_BOUND = {"bf16": 2e-2, "fp16": 5e-3}
L2_MULTIPLE = 3
UNSTABLE_SPREAD = 0.5  # (p80 - p20) / median above which the repeats are too unstable to rank by


@dataclass(frozen=True)
class TimingPolicy:
    warmup: int = 3
    min_reps: int = 5
    max_reps: int = 20
    target_ms: float = 2.0  # timed GPU time per measurement: reps = target / estimate
    retimes: int = 2  # more tries for a measurement above UNSTABLE_SPREAD


@dataclass(frozen=True)
class MeasureTask:
    """One problem's configs to time (and its ATen baseline when ``cublas``); a grouped
    problem's rows split among its experts as ``counts``."""

    problem: GemmProblem
    suite: str
    configs: tuple[KernelConfig, ...]
    cublas: bool = False
    policy: TimingPolicy = field(default_factory=TimingPolicy)
    counts: tuple[int, ...] | None = None


def require_gpu() -> int:
    """How many CUDA devices this process sees; CutetuneError("no CUDA GPU: <why>") if none.
    Commands call it before they spawn GPU workers, whose start-up would otherwise each fail
    with a traceback. Counting devices creates no CUDA context."""
    import warnings

    import torch

    if torch.version.cuda is None:
        why = f"torch {torch.__version__} is built without CUDA"
    else:
        with warnings.catch_warnings(record=True) as caught:  # torch says why as a warning
            warnings.simplefilter("always")
            n = torch.cuda.device_count()
        if n:
            return n
        said = [str(w.message) for w in caught if "CUDA" in str(w.message)]
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if said:
            why = said[0].split(" (Triggered internally")[0].removeprefix("CUDA initialization: ")
        elif visible is not None:
            why = f"CUDA_VISIBLE_DEVICES={visible!r} hides every device"
        else:
            why = "torch finds no CUDA device"
    raise CutetuneError(f"no CUDA GPU: {why.strip()} (--backend replay:PATH answers from a "
                        f"recorded dataset instead)")


# ------------------------------------------------------------------ worker-process state
_STATE: dict = {}


def init_gpu_worker(cache_dir: str | None, device_index: int = 0) -> None:
    """Worker initializer: import the heavy stack once, pin quack's kernel cache."""
    if cache_dir:
        os.environ["QUACK_CACHE_DIR"] = cache_dir
    import torch

    torch.cuda.set_device(device_index)
    torch.backends.cuda.matmul.allow_tf32 = False
    import quack.gemm_interface  # noqa: F401  (pays the cutlass import up front)

    _STATE["env"] = environment()
    _STATE["buffers"] = None


class ProblemBuffers:
    """Rotating operand sets for one problem plus its fp32 reference (set 0). With ``gated``
    each set also holds a gate tensor G shaped like D, and the reference is silu(G) * (A @ B):
    the fused SwiGLU GEMM's (``swiglu.py``)."""

    def __init__(self, problem: GemmProblem, l2_bytes: int, seed: int = 0, gated: bool = False):
        import torch

        self.problem = problem
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16}
        p = problem
        lead = (p.batch,) if p.batch > 1 else ()
        per_set = p.min_bytes + (p.batch * p.m * p.n * DTYPE_BYTES[p.out_dtype] if gated else 0)
        self.n_sets = max(2, min(4096, math.ceil(L2_MULTIPLE * l2_bytes / per_set)))
        g = torch.Generator(device="cuda").manual_seed(seed)
        ab = dt[p.dtype]
        # One allocation per operand for all sets (thousands of sets for tiny problems).
        a_all = torch.randn(self.n_sets, *lead, p.m, p.k, device="cuda", dtype=ab, generator=g)
        if p.a_major == "m":
            a_all = a_all.mT.contiguous().mT
        # B is (K, N): "k"-major is the transposed (N, K) weight of nn.Linear.
        if p.b_major == "k":
            b_all = torch.randn(self.n_sets, *lead, p.n, p.k, device="cuda", dtype=ab,
                                generator=g).mT
        else:
            b_all = torch.randn(self.n_sets, *lead, p.k, p.n, device="cuda", dtype=ab, generator=g)
        d_all = torch.empty(self.n_sets, *lead, p.m, p.n, device="cuda", dtype=dt[p.out_dtype])
        operands = [a_all, b_all, d_all]
        if gated:
            operands.append(torch.randn(self.n_sets, *lead, p.m, p.n, device="cuda",
                                        dtype=dt[p.out_dtype], generator=g))
        self.sets = [tuple(t[i] for t in operands) for i in range(self.n_sets)]
        a, b = self.sets[0][:2]
        self.ref = torch.matmul(a.float(), b.float())
        if gated:
            self.ref = torch.nn.functional.silu(self.sets[0][3].float()) * self.ref
        self.ref_norm = torch.linalg.vector_norm(self.ref)


def _buffers(problem: GemmProblem) -> ProblemBuffers:
    buf = _STATE.get("buffers")
    if buf is None or buf.problem != problem:
        _STATE["buffers"] = None  # free the previous problem's sets first
        import torch

        torch.cuda.empty_cache()
        buf = ProblemBuffers(problem, _STATE["env"]["l2_bytes"])
        _STATE["buffers"] = buf
    return buf


# Rows of the output differenced at a time: a whole difference in fp32 is as large as the
# reference (28 GiB for DeepSeek-V3's gate+up weight gradient), beside the reference, the
# output and the rotating sets.
ERROR_CHUNK_BYTES = 1 << 30


def relative_error(got, ref, ref_norm) -> float:
    """``||got - ref|| / ref_norm``, a slice of the first dim at a time (``ERROR_CHUNK_BYTES``
    of fp32 difference each; NaN where ``got`` holds one)."""
    import torch

    step = max(1, ERROR_CHUNK_BYTES // (4 * (ref.numel() // max(ref.shape[0], 1)) or 1))
    sq = sum(float(torch.linalg.vector_norm(got[i:i + step] - ref[i:i + step])) ** 2
             for i in range(0, ref.shape[0], step))
    norm = float(ref_norm)
    if norm == 0.0:  # as a tensor's division: NaN for 0/0, else inf
        return math.nan if sq == 0.0 or math.isnan(sq) else math.inf
    return math.sqrt(sq) / norm


def time_launches(fn, buf: ProblemBuffers, policy: TimingPolicy) -> tuple[list[float], float]:
    """Check numerics on set 0, then time launches over rotating sets. ``fn(a, b, d)`` (with
    ``gated`` buffers ``fn(a, b, d, g)``) writes the result into ``d`` or returns it (a
    compiled graph allocates its own output). Returns (times in ms, sorted; relative error)."""
    import torch

    d = buf.sets[0][2]
    d.fill_(float("nan"))
    res = fn(*buf.sets[0])
    got = d if res is None else res
    err = relative_error(got, buf.ref, buf.ref_norm)
    del res, got  # a returned output is not kept while the timed launches allocate theirs
    # Warm-up doubles as the estimate of kernel time (sets the repeats) and of host launch
    # time (sets how long the GPU sleeps while the host enqueues the timed launches).
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    for i in range(policy.warmup):
        fn(*buf.sets[(i + 1) % buf.n_sets])
    host_s = (time.perf_counter() - t0) / max(policy.warmup, 1)
    end.record()
    end.synchronize()
    est = max(start.elapsed_time(end) / max(policy.warmup, 1), 1e-3)
    reps = int(min(policy.max_reps, max(policy.min_reps, policy.target_ms / est)))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    # 1.5x the host's launch time per repeat, counted at the top SM clock (2 GHz): a slower
    # clock only sleeps longer, which is safe.
    torch.cuda._sleep(int(reps * (host_s + 10e-6) * 1.5 * 2e9))
    for i, (s, e) in enumerate(events):
        s.record()
        fn(*buf.sets[(policy.warmup + 1 + i) % buf.n_sets])
        e.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in events)
    return times, float(err)


def launch_host_us(device: str = "cuda", calls: int = 200, rounds: int = 5) -> float:
    """Host time of one ATen mm launch on tiny operands (torch.mm into an out tensor, the call
    Inductor's extern kernel makes), in us: the median of ``rounds`` batches after a warm-up.
    scripts/step_ab.py records it beside its step times: the host cost of a compiled step's
    launches differs between H200 machines by up to 2x, but this read alike on a slow and a
    fast one (data/inputs/steps/step_h200_mixed2.json, step_h200_mixed3.json), so the launch
    costs hedge over the spread instead of measuring the host (docs/design.md)."""
    import torch

    a, b = (torch.randn(16, 16, device=device, dtype=torch.bfloat16) for _ in range(2))
    out = torch.empty(16, 16, device=device, dtype=torch.bfloat16)
    for _ in range(20):
        torch.mm(a, b, out=out)
    batches = []
    for _ in range(rounds):
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            torch.mm(a, b, out=out)
        batches.append((time.perf_counter() - t0) / calls * 1e6)
    return float(np.median(batches))


def _row(task: MeasureTask, backend: str, config: KernelConfig | None, **outcome) -> dict:
    env = {k: v for k, v in _STATE["env"].items() if k not in ("l2_bytes", "host")}
    cfg = config.to_dict() if config else {}
    return {**env, **task.problem.to_dict(), **cfg, "problem_key": task.problem.key(),
            "suite": task.suite, "backend": backend,
            "config_key": config.short() if config else "", "timestamp": time.time(), **outcome}


def spread(times: list[float]) -> float:
    """(p80 - p20) / median of one measurement's repeat times."""
    p20, p50, p80 = np.quantile(times, [0.2, 0.5, 0.8])
    return float((p80 - p20) / p50)


def timed_outcome(fn, buf: ProblemBuffers, policy: TimingPolicy) -> dict:
    """``time_launches`` as a row's outcome: status (ok, wrong_result past the dtype's error
    bound, runtime_error when ``fn`` raises, on any try), error, median, p20, p80, repeats,
    relative error; and, for ``collect``'s stats (the dataset stores neither), ``retimes``
    (how many more tries an unstable measurement took) and ``unstable`` (still so after)."""
    import torch

    bound = REL_ERR_BOUND[buf.problem.out_dtype]
    try:
        times, err = time_launches(fn, buf, policy)
        tries = 0
        # a wrong result is not worth timing again
        while (spread(times) > UNSTABLE_SPREAD and tries < policy.retimes
               and math.isfinite(err) and err <= bound):
            tries += 1
            again, err_again = time_launches(fn, buf, policy)
            times = min(times, again, key=spread)
            err = math.nan if math.isnan(err_again) else max(err, err_again)
    except Exception as e:  # a config that raises is a data point, not the end of the run
        torch.cuda.synchronize()
        return {"status": "runtime_error", "error": f"{type(e).__name__}: {e}"[:1000]}
    ok = math.isfinite(err) and err <= bound
    return {"status": "ok" if ok else "wrong_result",
            "error": "" if ok else f"relative error {err:.3g} > {bound}",
            "time_ms": float(np.quantile(times, 0.5)),
            "time_ms_p20": float(np.quantile(times, 0.2)),
            "time_ms_p80": float(np.quantile(times, 0.8)), "n_reps": len(times), "rel_err": err,
            "retimes": tries, "unstable": spread(times) > UNSTABLE_SPREAD}


def _measure_one(task: MeasureTask, backend: str, config, fn, buf) -> dict:
    return _row(task, backend, config, **timed_outcome(fn, buf, task.policy))


def measure(task: MeasureTask) -> list[dict]:
    """A dense problem's rows: one per config (and one for cuBLAS when asked)."""
    import torch

    from ..kernels.quack_gemm import quack_kernel

    buf = _buffers(task.problem)
    rows = []
    if task.cublas:
        mm = lambda a, b, d: torch.matmul(a, b, out=d)  # noqa: E731
        rows.append(_measure_one(task, "cublas", None, mm, buf))
    for config in task.configs:
        t0 = time.perf_counter()
        try:
            gemm = quack_kernel(config, task.problem.arch)
            gemm(*buf.sets[0])  # loads the kernel from quack's cache (or compiles it)
            torch.cuda.synchronize()
        except Exception as e:
            torch.cuda.synchronize()
            rows.append(_row(task, "quack", config, status="runtime_error",
                             error=f"{type(e).__name__}: {e}"[:1000]))
            continue
        load_s = time.perf_counter() - t0
        row = _measure_one(task, "quack", config, gemm, buf)
        row["load_s"] = load_s
        rows.append(row)
    return rows
