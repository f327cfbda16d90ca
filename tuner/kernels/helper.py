"""Compile the kernels that Inductor is about to benchmark, in parallel, ahead of the benchmark.

In reduced mode Inductor benchmarks each GEMM node's top-k quack configs in this process, one
node after another; each cold config compiles on its first call (1.2-2.7 s apiece). The
prefetcher hands every kernel a graph will need to GPU-blind compile processes as soon as
Dynamo has traced it (``tuner/inductor/passes.py``), so they compile at once while AOTAutograd traces
and Inductor lowers and benchmarks. A plain mm kernel is built as a TVM-FFI library
(``gemm_library``), which this process's first launch loads without importing quack; any
other kernel goes to quack's disk cache (a worker compiles
under the kernel's exclusive file lock and exports the object file, which this process's first
launch of the config loads through quack, about 1 ms). Before a node's benchmark, Inductor's
preprocessing hook (``inductor.await_prefetched``) waits for that node's kernels still being
built: left to itself, this process reached most kernels before the workers had started and
compiled them one by one (7 of 8 at M=16 in data/bench/e2e_h200_recheck.json.gz). A kernel built
already is not waited for: the helper reports it only once its own imports are done, which
cost a warm compile 8-14 s on the H200 host (data/reports/gpu/h200_1gpu/session.log, call a
against call c). A kernel whose worker failed or timed out is compiled here as before, so a
slow or broken prefetcher never changes results, only compile time.

The workers come from one helper process that imports quack once and forks a child per
kernel, so a worker starts in a fraction of a second instead of paying ``import cutlass``. The
helper is forked from this process (``_ForkedHelper``) and fed over a pipe: it inherits what
this process has imported (torch, and Inductor if forked after it), and imports cutlass and
quack. A fresh interpreter took 13.5-15.7
s on the H200 host just to reach that point (loading torch's CUDA libraries, then cutlass and
quack: data/bench/helper_probe_h200.json.gz), longer than max-autotune's whole compile of the
benchmark's MLP. The helper never touches the GPU (quack's GPU-blind compile set-up), so the
parent's CUDA context, which a fork cannot share, does not matter to it; nothing of the user's
``__main__`` runs in it. ``enable(mode="reduced")`` starts it so it loads while Dynamo traces;
``cutetune.enable`` starts it before Inductor's import, so it loads while that runs too (it
then imports Dynamo itself, but not Inductor: ``_uncompiled_torch_compile``).

quack's own compile pool (``quack.cache.async_compile``) is not used instead: its submitter
imports quack, its sidecar is a fresh interpreter that the first submit waits for, and it makes
only quack's object files (docs/design.md).

The same helper builds the fused SwiGLU kernels' TVM-FFI libraries (``submit_swiglu``,
``aot.py``); in predicted mode it starts with the first such build.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import json
import logging
import os
import select
import signal
import sys
import threading
import time
import warnings

from ...space.config import KernelConfig
from ...space.problem import GemmProblem, GroupedProblem, problem_from_dict

from . import aot, library as gemm_library, problems, quack_gemm, swiglu
from .compile import compile_kernel, configure_gpu_blind, kernel_object_path, signature_class
from .problems import TORCH_DTYPE_OF


# A helper that has not imported quack by then is taken for hung (a fork can inherit a lock that
# another thread of this process held) and stopped: its kernels fail, so their callers build
# them themselves instead of waiting. Forked, it imported in 2.5-4.2 s on the H200 host
# (data/bench/helper_probe_h200_fork*.json.gz).
START_TIMEOUT_S = 60.0
# A build still running after this long is killed and reported failed (the slowest of all 1200
# sm90 kernels compiled in 6.2 s on the H200 host:
# data/reports/gpu/warm_space_check_h200x2.json.gz).
JOB_TIMEOUT_S = 300.0
# The lines the helper reports, by their first word.
REPORTS = ("imported", "started", "cached", "done", "failed")
_REPORTED = 3  # a build's exit status when it reported its own failure

log = logging.getLogger(__name__)


def kernel_key(problem: GemmProblem | GroupedProblem, config: KernelConfig) -> tuple:
    """What the prefetcher files a plain kernel under: ``("library", key)`` where the helper
    builds it as a TVM-FFI library (``gemm_library``; it needs a C compiler to link), which
    launches without quack; else its ``signature_class``, for quack's disk cache."""
    if isinstance(problem, GemmProblem) and aot.can_link() \
            and gemm_library.unsupported_reason(problem, config) is None:
        return ("library", gemm_library.library_key(problem, config))
    return signature_class(problem, config)


def is_library(key: tuple) -> bool:
    return key[0] == "library"


def default_workers() -> int:
    """Enough for a graph's top-k kernels of a few distinct GEMM shapes, a core left over."""
    return max(1, min(16, (os.cpu_count() or 2) - 1))


class KernelPrefetcher:
    """Submit (problem, config) kernels for their TVM-FFI libraries or, where they cannot have
    one, for compilation into quack's disk cache (``kernel_key``), and fused SwiGLU kernels
    for their libraries (``submit_swiglu``); each distinct kernel is submitted once per
    process, and a library built already not at all."""

    def __init__(self, arch: str, workers: int | None = None, cache_dir: str | None = None):
        self.arch, self.workers = arch, workers or default_workers()
        # quack's cache root as this process's quack sees it (set at its import from the env)
        quack_cache = sys.modules.get("quack.cache")
        self.cache_dir = cache_dir or (getattr(quack_cache, "CACHE_DIR", None) if quack_cache
                                       else os.environ.get("QUACK_CACHE_DIR"))
        self.enabled = os.environ.get("QUACK_CACHE_ENABLED", "1") == "1"  # no disk cache: no use
        # kernel -> "pending" | "done" (compiled) | "cached" (was on disk) | "failed: ..."
        self.state: dict[tuple, str] = {}
        self._ids: list = []
        self._kernels: dict[tuple, tuple[GemmProblem, KernelConfig]] = {}
        self._paths: dict = {}  # key -> the file that marks it built, once asked for
        self._proc: _ForkedHelper | None = None
        self._lock = threading.Lock()
        # (seconds since start, "imported ..." | "started ID" | "done ID" | ...): where a
        # wait goes
        self.timeline: list[tuple[float, str]] = []
        self._t0 = 0.0
        self._lost = "the compile helper exited"  # why kernels still pending will not come
        self._watchdog: threading.Timer | None = None

    def start(self) -> None:
        """Start the helper now (it imports quack in the background). If it cannot be forked
        the prefetcher turns itself off (kernels are then built where they are needed)."""
        if not self.enabled or self._proc is not None:
            return
        self._t0 = time.monotonic()
        try:
            self._proc = _ForkedHelper(self.arch, self.workers, self.cache_dir)
        except OSError as e:
            log.warning("cutetune: the compile helper could not start (%s); kernels are built "
                        "where they are needed", e)
            self.enabled = False
            return
        log.info("cutetune: compile helper forked")
        threading.Thread(target=self._read, args=(self._proc,), daemon=True).start()
        self._watchdog = threading.Timer(START_TIMEOUT_S, self._stop_if_not_started,
                                         (self._proc,))
        self._watchdog.daemon = True
        self._watchdog.start()

    def _stop_if_not_started(self, helper: "_ForkedHelper") -> None:
        if not helper.exited and not any(e.startswith("imported") for _, e in self.timeline):
            log.warning("cutetune: the compile helper did not start in %g s; stopping it "
                        "(its kernels are built where they are needed)", START_TIMEOUT_S)
            self._lost = f"the compile helper did not start in {START_TIMEOUT_S:g} s"
            helper.terminate()

    def _read(self, helper: "_ForkedHelper") -> None:
        try:
            for line in helper.reports:
                self._report(line)
        finally:
            helper.reap()
            with self._lock:  # the helper is gone: nothing pending will finish
                for key, s in self.state.items():
                    if s == "pending":
                        self.state[key] = f"failed: {self._lost}"

    def _report(self, line: str) -> None:
        """Take one line of the helper's reports; anything else is skipped."""
        status, _, rest = line.rstrip("\n").partition(" ")
        if status not in REPORTS:
            return
        self.timeline.append((round(time.monotonic() - self._t0, 3), line.strip()[:80]))
        if status in ("imported", "started"):
            return
        idx, _, detail = rest.partition(" ")
        with self._lock:
            if idx.isdigit() and int(idx) < len(self._ids):
                self.state[self._ids[int(idx)]] = (status if status in ("done", "cached")
                                                   else f"failed: {detail}")

    def submit(self, kernels) -> int:
        """Queue the kernels of ``(problem, config)`` pairs not queued before; how many."""
        jobs = []
        for problem, config in kernels:
            key = kernel_key(problem, config)
            if is_library(key):
                if self._unbuilt(key, key[1]):
                    jobs.append((key, ["gemm_library", problem.to_dict(), config.to_dict()]))
                continue
            self._kernels.setdefault(key, (problem, config))
            jobs.append((key, ["gemm", problem.to_dict(), config.to_dict()]))
        return self._queue(jobs)

    def submit_swiglu(self, problem: GemmProblem, config: KernelConfig) -> str:
        """Queue the library build (``swiglu.build_library``) of the fused SwiGLU kernel
        for ``problem``'s up projection unless it is built or queued; its key
        (``swiglu.library_key``)."""
        majors = (problem.a_major, problem.b_major)
        key = swiglu.library_key(config, self.arch, TORCH_DTYPE_OF[problem.dtype], majors)
        if self._unbuilt(key, key):
            self._queue([(key, ["swiglu", config.to_dict(), problem.dtype, majors])])
        return key

    def _unbuilt(self, key, library: str) -> bool:
        """Whether the TVM-FFI library ``library`` (a kernel filed under ``key``) is not built
        yet; its file's path is kept for ``wait_for``."""
        self._paths.setdefault(key, aot.library_paths(library)[1])
        return not self._paths[key].exists()

    def _queue(self, jobs) -> int:
        if not self.enabled:
            return 0
        self.start()
        if self._proc is None:  # it could not start
            return 0
        lines = []
        with self._lock:
            for key, job in jobs:
                if key in self.state:
                    continue
                self.state[key] = "pending"
                self._ids.append(key)
                lines.append(json.dumps([len(self._ids) - 1, *job]))
        try:
            self._proc.jobs.write("".join(f"{ln}\n" for ln in lines))
            self._proc.jobs.flush()
        except (BrokenPipeError, OSError, ValueError):
            with self._lock:
                for key in self._ids[len(self._ids) - len(lines):]:
                    self.state[key] = f"failed: {self._lost}"
        return len(lines)

    def stats(self) -> dict:
        with self._lock:
            states = list(self.state.values())
        return {"submitted": len(states), "done": states.count("done"),
                "cached": states.count("cached"),
                "failed": sum(s.startswith("failed") for s in states)}

    def build_state(self, key) -> str:
        """A kernel's build, without waiting: "pending", "done" (also when the helper found
        it built, or it was built before it could be queued) or "failed: why"."""
        with self._lock:
            state = self.state.get(key, "done")
        return "done" if state == "cached" else state

    def wait(self, timeout: float | None = None) -> dict:
        """Block until the helper has reported every submitted kernel (tests, benchmarks)."""
        def reported():
            with self._lock:
                return "pending" not in self.state.values()

        _poll(reported, timeout)
        return self.stats()

    def failures(self) -> dict[str, str]:
        """The kernels the helper failed to build, each with why (tests, benchmarks)."""
        with self._lock:
            return {str(k): s for k, s in self.state.items() if s.startswith("failed")}

    def wait_for(self, keys, timeout: float | None = None) -> bool:
        """Block until each of these kernels (``kernel_key`` keys) is reported by the helper or
        is built already (another process built it, or the helper, which only reports once its
        own start is over), or the timeout passed; keys never submitted are not waited for.
        True if none is left waiting. A kernel for quack's disk cache needs quack imported in
        this process (the object file's path is quack's key)."""
        def ready():
            with self._lock:
                pending = [k for k in keys if self.state.get(k) == "pending"]
            return all(self._on_disk(k) for k in pending)

        return _poll(ready, timeout)

    def _on_disk(self, key) -> bool:
        if key not in self._paths:
            self._paths[key] = kernel_object_path(*self._kernels[key], self.cache_dir)
        return self._paths[key].exists()

    def close(self) -> None:
        """Stop the helper once its running compiles end (queued ones are dropped)."""
        if self._proc is not None:
            if self._watchdog is not None:
                self._watchdog.cancel()
            self._proc.terminate()
            self._proc = None


# arch -> this process's prefetcher (``shared_prefetcher``)
SHARED_PREFETCHERS: dict[str, KernelPrefetcher] = {}


def shared_prefetcher(arch: str) -> KernelPrefetcher:
    """This process's prefetcher for ``arch``: compile workers are a process-wide resource (its
    helper is stopped at exit)."""
    if arch not in SHARED_PREFETCHERS:
        import atexit

        SHARED_PREFETCHERS[arch] = KernelPrefetcher(arch)
        atexit.register(SHARED_PREFETCHERS[arch].close)
    return SHARED_PREFETCHERS[arch]


def start_for_this_gpu() -> str | None:
    """Start the shared prefetcher's helper for the current CUDA device, if quack's GEMM runs
    there; its arch, else None."""
    import torch

    arch = torch.cuda.is_available() and problems.device_arch(torch.device("cuda"))
    if not arch:
        return None
    shared_prefetcher(arch).start()
    return arch


class _ForkedHelper:
    """The helper process, forked from this one to run ``serve``: job lines go to ``jobs``,
    its reports come from ``reports`` (text, line-buffered; a pipe of its own, so nothing else
    it prints can reach them)."""

    def __init__(self, arch: str, workers: int, cache_dir: str | None) -> None:
        jobs_r, jobs_w = os.pipe()
        reports_r, reports_w = os.pipe()
        quack_gemm.await_background_import()
        try:
            with warnings.catch_warnings():  # "use of fork() may lead to deadlocks in the
                # child": it runs only serve(), takes no lock of this process's other threads
                # (quack's import was just awaited) and never touches CUDA
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:
            for fd in (jobs_r, jobs_w, reports_r, reports_w):
                os.close(fd)
            raise
        if pid == 0:
            _run_forked(jobs_r, reports_w, arch, workers, cache_dir)
        os.close(jobs_r)
        os.close(reports_w)
        self.pid, self.exited, self._lock = pid, False, threading.Lock()
        self.jobs = os.fdopen(jobs_w, "w", buffering=1)
        self.reports = os.fdopen(reports_r, "r", errors="replace")

    def terminate(self) -> None:
        """SIGTERM it, unless it was reaped (its pid may be another process's by then), and
        close its input."""
        with self._lock:
            if not self.exited:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGTERM)
        with contextlib.suppress(OSError, ValueError):
            self.jobs.close()

    def reap(self) -> None:
        """Once its reports ended: collect its exit status (no zombie), close the pipe."""
        with self._lock:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.exited = True
        self.reports.close()


def _poll(condition, timeout: float | None) -> bool:
    """Check ``condition`` every 20 ms until it holds (True) or ``timeout`` s passed (False)."""
    end = None if timeout is None else time.monotonic() + timeout
    while not condition():
        if end is not None and time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


# ---------------------------------------------------------------- the helper process
def _run_forked(jobs_fd: int, reports_fd: int, arch: str, workers: int,
                cache_dir: str | None) -> None:
    """The forked child: jobs and reports each keep a descriptor of their own, stdin, stdout
    and stderr are /dev/null (nothing a library reads or prints there meets them), every other
    descriptor it inherited is closed (so the parent's pipes still see their ends), the
    parent's signal handlers and logging are off, and it serves until its input closes. Never
    returns."""
    gc.freeze()  # collections here leave the parent's objects alone (and uncopied)
    code = 0
    try:
        for sig in signal.valid_signals():
            handler = signal.getsignal(sig)
            if callable(handler) and handler is not signal.default_int_handler:
                with contextlib.suppress(OSError, ValueError, RuntimeError):
                    signal.signal(sig, signal.SIG_DFL)
        logging.disable(logging.CRITICAL)
        jobs = fcntl.fcntl(jobs_fd, fcntl.F_DUPFD, 3)  # above 2 whatever the parent had open
        reports = fcntl.fcntl(reports_fd, fcntl.F_DUPFD, 3)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        _close_inherited(keep=(jobs, reports))
        sys.stdin = open(0, closefd=False)  # noqa: SIM115  (the process ends with os._exit)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        if cache_dir:
            os.environ["QUACK_CACHE_DIR"] = cache_dir
        serve(arch, workers, jobs, open(reports, "w", buffering=1))  # noqa: SIM115
    except BaseException:  # noqa: BLE001  (the parent sees its reports end)
        code = 1
    finally:
        os._exit(code)


def _close_inherited(keep: tuple[int, ...]) -> None:
    """Close every descriptor above 2 but those in ``keep`` (those /proc lists, else every
    number)."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = range(3, os.sysconf("SC_OPEN_MAX"))
    for fd in fds:
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def _job(arch: str, kind: str, *payload):
    """(whether it is built already, how to build it) for one job line of ``serve``."""
    if kind in ("gemm", "gemm_library"):
        problem, config = problem_from_dict(payload[0]), KernelConfig.from_dict(payload[1])
        if kind == "gemm_library":
            return (aot.library_ready(gemm_library.library_key(problem, config)),
                    lambda: gemm_library.build_library(problem, config))
        return (kernel_object_path(problem, config).exists(),
                lambda: compile_kernel(problem, config))
    config, dtype, majors = (KernelConfig.from_dict(payload[0]), TORCH_DTYPE_OF[payload[1]],
                             tuple(payload[2]))
    return (aot.library_ready(swiglu.library_key(config, arch, dtype, majors)),
            lambda: swiglu.build_library(config, arch, dtype, majors))


@contextlib.contextmanager
def _uncompiled_torch_compile():
    """``torch.compile`` hands back the function it is given, for the helper's imports: quack
    wraps its block-scaled quantizers in ``torch.compile`` at import, and that call imports
    Inductor, which a helper forked before the compiling process imported it
    (``cutetune.enable``) would otherwise import too. The helper never runs those quantizers;
    if it did, they would run uncompiled."""
    import torch

    def uncompiled(model=None, **_options):
        return model if model is not None else (lambda fn: fn)

    compile_, torch.compile = torch.compile, uncompiled
    try:
        yield
    finally:
        torch.compile = compile_


def serve(arch: str, workers: int, jobs: int, reports) -> None:
    """Import quack and all its builds need (then report ``imported`` with the seconds the
    GPU-blind set-up and quack's import took: the rest of the time to that line, in the
    caller's timeline, is the fork), then read ``[id, kind, ...]`` job lines from the
    descriptor ``jobs`` (``gemm``: a kernel into quack's disk cache; ``swiglu``: a fused
    kernel's TVM-FFI library; ``gemm_library``: a plain kernel's); report ``cached ID`` for one
    built already, else build it in a child forked from this process, at most ``workers`` at
    a time (reporting ``started ID``), and ``done ID`` or ``failed ID why`` as each ends (a
    build past JOB_TIMEOUT_S is killed). Reports are lines written to the text stream
    ``reports``. Exits after its input closes and its children end. SIGTERM: children finish
    their kernel (a kernel is written whole or not at all), queued ones are dropped."""
    def report(line: str) -> None:
        reports.write(f"{line}\n")
        reports.flush()

    t0 = time.perf_counter()
    with _uncompiled_torch_compile():
        configure_gpu_blind(arch, os.environ.get("QUACK_CACHE_DIR"))
        t1 = time.perf_counter()
        # what every child would import, once, here: an import a child started could wait
        # forever on a lock a thread of the process this one was forked from held
        import quack.cache.jit  # noqa: F401
        import quack.gemm  # noqa: F401
        import quack.gemm_runtime.host  # noqa: F401

        from . import epilogues  # noqa: F401

        quack_gemm.import_quack()  # what a plain kernel's library is built through

    gc.freeze()  # and each kernel's child leaves the imports' objects alone
    report(f"imported gpu_blind={t1 - t0:.2f} quack={time.perf_counter() - t1:.2f}")
    queue: list[list] = []
    running: dict[int, tuple[int, float]] = {}  # pid -> (id, when it is killed)
    buf, open_input = b"", True
    while open_input or queue or running:
        while queue and len(running) < workers:
            idx, *job = queue.pop(0)
            cached, build = _job(arch, *job)
            if cached:
                report(f"cached {idx}")
                continue
            report(f"started {idx}")
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    build()
                except BaseException as e:  # noqa: BLE001
                    report(f"failed {idx} {type(e).__name__}: {e}"[:300].replace("\n", " "))
                    code = _REPORTED
                os._exit(code)
            running[pid] = (idx, time.monotonic() + JOB_TIMEOUT_S)
        for pid, (idx, deadline) in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if not done and time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                running.pop(pid)
                report(f"failed {idx} killed after {JOB_TIMEOUT_S:g} s")
            elif done:
                running.pop(pid)
                code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
                if code != _REPORTED:
                    report(f"done {idx}" if code == 0 else f"failed {idx} exit status {status}")
        if open_input and select.select([jobs], [], [], 0.05)[0]:
            chunk = os.read(jobs, 1 << 16)
            if not chunk:
                open_input = False
            buf += chunk
            *lines, buf = buf.split(b"\n")
            queue += [json.loads(ln) for ln in lines if ln.strip()]
        elif not open_input:
            time.sleep(0.05)
