"""What the benchmark scripts share: ``import benchlib`` (``python scripts/NAME.py`` puts
scripts/ first on sys.path, so no script edits it).

- the workloads (Llama-3-8B's decoder MLP and attention projections) and their timing
  (``time_calls``, with ``cpu_sample``/``cpu_during``), kernel counts of Inductor's output code
  and the relative error against eager: bench_e2e.py, step_ab.py, step_dynamic.py;
- the issue's limits and their checks (``LIMITS``, ``limit_check``, ``geomean_check``):
  bench_e2e.py and step_ab.py;
- every mode compiled in one process and timed in interleaved rounds (``compiled_step``,
  ``mode_installation``, ``run_and_capture_code``, ``wait_for_helpers``, ``interleaved``,
  ``pinned``): step_ab.py and step_dynamic.py;
- the model families of the Triton mm sweep (``FAMILIES``, ``family_of``): triton_mm_sweep.py
  and triton_mm_report.py;
- the CPU benchmarks' problems and host name (``SHAPES``, ``cpu_name``): bench_features.py and
  bench_rank.py;
- a figure saved as a small PNG (``save_png``): bench_e2e.py and bench_moe.py.

Only the sweep's families import cutetune here (``cutetune.space.suites``, plain Python);
torch is passed in or imported where it is used.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import time
from pathlib import Path

import numpy as np

from cutetune.space.suites import LLM_LAYERS

HIDDEN, INTER, KV = 4096, 14336, 1024


# ================================================================ workloads and their timing
def workload_classes(torch):
    nn = torch.nn

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(HIDDEN, INTER, bias=False)
            self.up = nn.Linear(HIDDEN, INTER, bias=False)
            self.down = nn.Linear(INTER, HIDDEN, bias=False)

        def forward(self, x):
            return self.down(nn.functional.silu(self.gate(x)) * self.up(x))

    class AttnProj(nn.Module):
        """q/k/v projections of x and the output projection (applied to q, which has the
        attention output's shape: the attention itself is not a GEMM node)."""

        def __init__(self):
            super().__init__()
            self.q = nn.Linear(HIDDEN, HIDDEN, bias=False)
            self.k = nn.Linear(HIDDEN, KV, bias=False)
            self.v = nn.Linear(HIDDEN, KV, bias=False)
            self.o = nn.Linear(HIDDEN, HIDDEN, bias=False)

        def forward(self, x):
            return self.o(self.q(x)), self.k(x), self.v(x)

    return {"mlp": MLP, "attn": AttnProj}


# Calls run before timing, at least this long: the first timed runs (M=16, same three ATen
# GEMMs in two processes: 192 vs 104 us in data/bench/e2e_h200.json.gz) came right after compile,
# three calls in, and disagreed far beyond noise.
WARMUP_S = 0.5
# Each timed batch of calls lasts about this long (data/bench/e2e_h200.json.gz timed 10 batches of
# ~2 ms, and identical kernels differed by up to 16 % at M >= 1024 between processes).
BATCH_S = 10e-3


def time_calls(torch, fn, x, repeats: int, warmup_s: float = WARMUP_S) -> dict:
    """ms per call over ``repeats`` CUDA-event-timed batches of calls (each about BATCH_S),
    after ``warmup_s`` of calls: the median, with p20 and p80 as the spread; ``host`` is the
    median time to issue one call (well under the median: GPU-bound; near it: host-bound, or
    the launch queue is full); ``cpu`` what the threads of this process and the whole machine
    ran meanwhile (``cpu_during``); ``batches`` each batch's ms per call."""
    t0, calls = time.perf_counter(), 0
    while calls < 3 or time.perf_counter() - t0 < warmup_s:
        fn(x)
        calls += 1
        if calls % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(x)
    torch.cuda.synchronize()
    iters = max(1, min(1000, int(BATCH_S / max(time.perf_counter() - t0, 1e-6))))
    times, host = [], []
    cpu_before = cpu_sample()
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn(x)
        host.append((time.perf_counter() - t0) * 1e3 / iters)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters)
    median, p20, p80 = np.quantile(times, (0.5, 0.2, 0.8))
    return {"median": float(median), "p20": float(p20), "p80": float(p80),
            "host": float(np.median(host)), "cpu": cpu_during(cpu_before, cpu_sample()),
            "batches": times}


def cpu_sample() -> dict | None:
    """CPU jiffies of this process's threads (by name) and of the machine, from /proc (None
    off Linux)."""
    try:
        threads = {}
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            threads[f"{name}/{tid}"] = int(fields[11]) + int(fields[12])  # utime + stime
        with open("/proc/stat") as f:
            total = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return None
    return {"t": time.perf_counter(), "threads": threads,  # busy: less idle, iowait, steal
            "busy": sum(total) - sum(total[3:5]) - sum(total[7:8]), "total": sum(total),
            "steal": sum(total[7:8])}


def cpu_during(a: dict | None, b: dict | None) -> dict | None:
    """Cores' worth of CPU between two samples: each thread of this process above 2 % of a
    core, the machine's busy cores (other processes included), and the cores' worth its
    hypervisor ran other guests on instead (steal: a virtual machine's noisy neighbours)."""
    if a is None or b is None:
        return None
    span = (b["t"] - a["t"]) * os.sysconf("SC_CLK_TCK")
    threads = {k: round((v - a["threads"].get(k, 0)) / span, 3) for k, v in b["threads"].items()}
    return {"threads": {k: v for k, v in sorted(threads.items(), key=lambda kv: -kv[1])
                        if v >= 0.02},
            "machine_busy_cores": round((b["busy"] - a["busy"]) / span, 2),
            "steal_cores": round((b["steal"] - a["steal"]) / span, 3)}


def kernel_counts(code: str) -> dict:
    return {
        "quack": len(re.findall(r"extern_kernels\.cutetune_quack_(?:add)?mm\(", code)),
        "aten": len(re.findall(r"extern_kernels\.(?:mm|addmm|bmm|bias_addmm)\(", code)),
        "triton_template": len(re.findall(r"\btriton_tem_\w+\.run\(", code)),
        # the fused op as an extern kernel, or (before 2026-12-01, or under the C++ wrapper) as
        # the custom op
        "quack_swiglu": len(re.findall(r"extern_kernels\.cutetune_quack_mm_silu_mul\(|"
                                       r"torch\.ops\.cutetune\.mm_silu_mul\.default\(", code)),
        # a config per range of a dynamic M (ATen in some ranges)
        "quack_by_m": len(re.findall(r"extern_kernels\.cutetune_quack_(?:add)?mm_by_m\(", code)),
        "quack_swiglu_by_m": len(re.findall(
            r"extern_kernels\.cutetune_quack_mm_silu_mul_by_m\(|"
            r"torch\.ops\.cutetune\.mm_silu_mul_by_m\.default\(", code)),
    }


def rel_err(torch, out, ref) -> float:
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    return max(((o.float() - r.float()).norm() / r.float().norm()).item()
               for o, r in zip(outs, refs))


# ================================================================ the issue's limits
# Issue #6's limits, one per check (``targets`` in bench_e2e.py, ``step_targets`` in step_ab.py).
LIMITS = {"predicted_compile_cold_over_default_s": 2.0,
          "predicted_compile_warm_over_default_s": 0.5,
          "predicted_step_over_best_ratio": 1.01,
          "reduced_compile_cold_over_max_autotune_s": 0.0,
          "reduced_compile_warm_over_max_autotune_s": 0.0,
          "reduced_step_over_predicted_ratio": 1.01,
          "predicted_step_geomean_m_ge_1024_over_best": 0.97}


def limit_check(by_m: dict, limit: float) -> dict:
    """A check of a value per M against ``limit`` (met: every value at most the limit)."""
    return {"limit": limit, "by_m": by_m, "checked": len(by_m),
            "met": all(v <= limit for v in by_m.values()) if by_m else None}


def geomean_check(values: list, limit: float) -> dict:
    """A check of the geometric mean of ``values`` against ``limit``."""
    from cutetune.models.evaluate import geomean

    gm = geomean(values) if values else None
    return {"limit": limit, "value": gm, "checked": len(values),
            "met": None if gm is None else gm <= limit}


# ================================================================ every mode in one process
def fresh_step(module):
    """``step(x) = module(x)`` with a code object of its own: Dynamo caches compiled code per
    code object, so each mode's compile stays its own."""
    namespace = {"module": module}
    exec("def step(x):\n    return module(x)\n", namespace)  # noqa: S102
    return namespace["step"]


def cutetune_variables() -> dict:
    """The CUTETUNE_ variables this run saw: ``enable()`` takes its unset arguments from them,
    so a result file records them beside its modes."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("CUTETUNE_")}


def mode_installation(mode: str, heldout_model: str | None):
    """The mode's cutetune installation (a context manager; none for default and
    max-autotune): predicted-heldout is predicted with ``heldout_model``, predicted-unfused
    predicted without the SwiGLU fusion."""
    from cutetune.tuner.inductor import enable

    if mode == "predicted-heldout":
        return enable("predicted", model=heldout_model)
    if mode == "predicted-unfused":
        return enable("predicted", fuse_swiglu=False)
    return enable(mode) if mode in ("predicted", "reduced") else contextlib.nullcontext()


def compiled_step(module, mode: str, cuda_graphs: bool = False):
    """The mode's ``torch.compile`` of ``module``'s own step (max-autotune: ATen and Triton
    GEMM backends, as in bench_e2e.py). ``cuda_graphs``: as torch.compile's
    mode="reduce-overhead" (``triton.cudagraphs``), and max-autotune as its mode="max-autotune",
    which also tunes the pointwise kernels (``coordinate_descent_tuning``)."""
    import torch

    options = ({"max_autotune": True, "max_autotune_gemm_backends": "ATEN,TRITON"}
               if mode == "max-autotune" else {})
    if cuda_graphs:
        options = {**options, "triton.cudagraphs": True, **(
            {"coordinate_descent_tuning": True} if mode == "max-autotune" else {})}
    return torch.compile(fresh_step(module), options=options or None)


def interleaved(torch, fns: dict, x, rounds: int, repeats: int = 3) -> dict:
    """Each of ``fns`` timed on ``x`` in ``rounds`` rounds, each round starting one function
    later than the last (so that none always runs after the same one): name -> the rounds'
    ``time_calls`` results (``repeats`` batches each)."""
    timed, order = {name: [] for name in fns}, list(fns)
    for r in range(rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:
            timed[name].append(time_calls(torch, fns[name], x, repeats=repeats, warmup_s=0.0))
    return timed


def gpu_kernels(torch, step, steps: int = 5, top: int = 12, host: bool = False) -> dict:
    """The GPU's kernel time per step (``busy_ms``; the step time less it is the GPU idle,
    waiting on the host), its kernels per step, and the ``top`` kernels by time, from torch's
    profiler over ``steps`` steps run apart from the timed ones; ``error`` where it recorded
    none or failed (a record, not a crash: the timed results stand without it). With
    ``host``, also the host's time to issue a step with the GPU idle at its start
    (``host_ms``, median of ``steps``: a step timed near it waits on the host) and the ``top``
    host ops by their own time (``host_ops``, profiled, so slower than unprofiled)."""
    from torch.profiler import ProfilerActivity, profile

    out = {}
    try:
        if host:
            issue = []
            for _ in range(steps):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                step()
                issue.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
            out["host_ms"] = 1e3 * float(np.median(issue))
        with profile(activities=[ProfilerActivity.CUDA]
                     + ([ProfilerActivity.CPU] if host else [])) as prof:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
        events = prof.key_averages()
    except Exception as e:  # noqa: BLE001  (no CUPTI, no CUDA activity on this build, ...)
        return {**out, "error": f"{type(e).__name__}: {e}"[:300]}
    cuda = torch.autograd.DeviceType.CUDA  # kernels, copies, memsets: no op counts them twice
    kernels = sorted(((k.key, k.device_time_total / steps / 1e3, k.count / steps)
                      for k in events if k.device_type == cuda), key=lambda r: -r[1])
    if not kernels:  # a host whose profiler may not read the GPU (CUPTI) records nothing
        return {**out, "error": "the profiler recorded no GPU activity"}
    if host:
        ops = sorted(((k.key, k.self_cpu_time_total / steps / 1e3, k.count / steps)
                      for k in events if k.device_type != cuda), key=lambda r: -r[1])
        out["host_ops"] = [{"name": name[:120], "ms": ms, "per_step": n}
                           for name, ms, n in ops[:top]]
    return {**out, "busy_ms": sum(ms for _, ms, _ in kernels),
            "kernels_per_step": sum(n for _, _, n in kernels),
            "kernels": [{"name": name[:120], "ms": ms, "per_step": n}
                        for name, ms, n in kernels[:top]]}


def run_and_capture_code(fn, x):
    """``fn(x)`` and the output code Inductor generates meanwhile. Not Inductor's
    ``run_and_get_code``: it resets Dynamo, which throws away the modes compiled before, so
    they compile again when timed, outside their cutetune installation (as the default's code).
    Until 2026-11-30 step_ab.py timed every mode but the last compiled that way."""
    from unittest import mock

    from torch._inductor.graph import GraphLowering

    codes = []
    with mock.patch.object(GraphLowering, "save_output_code", codes.append):
        out = fn(x)
    return out, codes


def wait_for_helpers(timeout_s: float) -> dict:
    """Let cutetune's compile helpers finish what they were sent (the fused kernels predicted
    mode builds beside the compile; calls run ATen until then): what each reported."""
    from cutetune.tuner.kernels import helper as prefetch

    return {arch: {**helper.wait(timeout=timeout_s), "failures": helper.failures()}
            for arch, helper in prefetch.SHARED_PREFETCHERS.items()}


def allowed_cpus(cpu: int) -> set[int]:
    """The CPUs this thread may run on, which must hold ``cpu`` (ValueError naming them)."""
    allowed = os.sched_getaffinity(0)
    if cpu not in allowed:
        raise ValueError(f"cannot pin to CPU {cpu}: this process may run on CPUs "
                         f"{sorted(allowed)} only")
    return allowed


@contextlib.contextmanager
def pinned(cpu: int | None):
    """The calling thread on ``cpu`` alone meanwhile (None: as it was)."""
    if cpu is None:
        yield
        return
    before = allowed_cpus(cpu)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


# ================================================================ the Triton mm sweep's families
# (N, K) of the Linear layers (out, in features) of each model family swept, in sweep order.
FAMILIES: dict[str, tuple[tuple[int, int], ...]] = {
    "llama3_8b": ((4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (6144, 4096)),
    "llama3_70b": tuple(LLM_LAYERS["llama3_70b"].values()),
    "llama3.2_1b": ((2048, 2048), (512, 2048), (8192, 2048), (2048, 8192)),
    **{f: tuple(dict.fromkeys(LLM_LAYERS[f].values()))
       for f in ("qwen2.5_7b", "mistral_nemo_12b", "phi3_mini")},
}


def family_of(n: int, k: int) -> str:
    """The first family with a layer of this (N, K), or "other"."""
    return next((f for f, nks in FAMILIES.items() if (n, k) in nks), "other")


# ================================================================ CPU benchmarks
# Square, skinny (decode-like, where split-K and swap_ab matter), batched with odd sizes.
SHAPES = (
    dict(m=4096, n=4096, k=4096),
    dict(m=16, n=8192, k=8192),
    dict(m=8192, n=1024, k=28672, a_major="m"),
    dict(m=1000, n=1000, k=64, batch=8),
)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def save_png(fig, path) -> None:
    """``fig`` as a PNG of a 256-colour palette: the same lines at a third of the bytes
    (Pillow comes with matplotlib)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    Image.open(buf).convert("RGB").quantize(256).save(path, optimize=True)
