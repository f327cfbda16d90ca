"""A process pool that survives its tasks: a task that crashes or hangs its worker is reported
as such, the worker is replaced, and the other tasks go on.

concurrent.futures breaks the whole pool when one worker dies and cannot time out a single
task; compiling thousands of kernels (cute.compile may abort the process) and launching
untried kernels on a GPU (an illegal access kills the CUDA context) need both.
"""

from __future__ import annotations

import multiprocessing as mp
from collections import deque
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable, Iterable, Iterator


@dataclass(frozen=True)
class TaskResult:
    index: int
    status: str  # "ok" | "error" (fn raised) | "crash" (worker died) | "timeout"
    value: Any = None
    error: str = ""
    seconds: float = 0.0


def _worker_main(conn, initializer, initargs, fn) -> None:
    if initializer is not None:
        initializer(*initargs)
    conn.send(("ready", None))
    while True:
        msg = conn.recv()
        if msg is None:
            return
        index, task = msg
        try:
            conn.send(("ok", fn(task)))
        except Exception as e:  # reported to the parent; the worker stays usable
            tb = traceback.format_exception(type(e), e, e.__traceback__)
            conn.send(("error", f"{type(e).__name__}: {e} | {''.join(tb[-3:]).strip()[-800:]}"))


class _Worker:
    def __init__(self, ctx, fn, initializer, initargs):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, initializer, initargs, fn),
                                daemon=True)
        self.proc.start()
        child.close()
        self.ready = False
        self.task: int | None = None
        self.started = 0.0

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


class IsolatedPool:
    """Run ``fn(task)`` over tasks in ``n_workers`` processes, each task with its own timeout.

    ``initializer(*initargs)`` runs once per worker (and again in each replacement); its time
    does not count against task timeouts. ``fn`` and ``initializer`` must be importable
    top-level functions (workers are spawned, never forked from a CUDA-initialized parent).
    """

    def __init__(self, fn: Callable, n_workers: int, *, initializer: Callable | None = None,
                 initargs: tuple = (), timeout_s: float = 120.0, start_method: str = "spawn"):
        self.fn, self.n_workers = fn, max(1, n_workers)
        self.initializer, self.initargs, self.timeout_s = initializer, initargs, timeout_s
        self.ctx = mp.get_context(start_method)
        self.workers: list[_Worker] = []
        self._queue: deque = deque()
        self._next = 0

    def _spawn(self) -> _Worker:
        return _Worker(self.ctx, self.fn, self.initializer, self.initargs)

    def __enter__(self) -> "IsolatedPool":
        self.workers = [self._spawn() for _ in range(self.n_workers)]
        return self

    def __exit__(self, *exc) -> None:
        for w in self.workers:
            try:
                if w.proc.is_alive() and w.task is None and w.ready:
                    w.conn.send(None)
            except OSError:
                pass
            w.kill()
        self.workers = []

    def submit(self, task: Any) -> int:
        """Queue ``task``; its result comes back from ``poll`` with this index."""
        self._queue.append((self._next, task))
        self._next += 1
        return self._next - 1

    @property
    def outstanding(self) -> int:
        """Tasks submitted whose result has not been returned yet."""
        return len(self._queue) + sum(w.task is not None for w in self.workers)

    @property
    def idle(self) -> bool:
        return not self._queue and all(w.task is None for w in self.workers)

    def poll(self, timeout: float | None = None) -> list[TaskResult]:
        """Hand queued tasks to free workers; wait up to ``timeout`` s for results."""
        for w in self.workers:
            if w.ready and w.task is None and self._queue:
                w.task, task = self._queue.popleft()
                w.started = time.monotonic()
                w.conn.send((w.task, task))
        busy = [w for w in self.workers if w.task is not None or not w.ready]
        now = time.monotonic()
        wait_s = min([w.started + self.timeout_s - now for w in busy if w.task is not None]
                     + ([timeout] if timeout is not None else []), default=None)
        ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy],
                     timeout=None if wait_s is None else max(0.0, wait_s))
        results = []
        for i, w in enumerate(self.workers):
            result = None
            if w.conn in ready or w.proc.sentinel in ready:
                try:
                    kind, value = w.conn.recv() if w.conn.poll() else ("crash", None)
                except (EOFError, OSError):
                    kind, value = "crash", None
                if kind == "ready":
                    w.ready = True
                    continue
                if w.task is None:  # died while starting: the initializer failed
                    w.proc.join(2)
                    raise RuntimeError(f"worker failed to start (exit {w.proc.exitcode})")
                elapsed = time.monotonic() - w.started
                if kind == "crash":
                    w.proc.join(2)
                    result = TaskResult(w.task, "crash", seconds=elapsed,
                                        error=f"worker died (exit code {w.proc.exitcode})")
                elif kind == "error":
                    result = TaskResult(w.task, "error", error=value, seconds=elapsed)
                else:
                    result = TaskResult(w.task, "ok", value=value, seconds=elapsed)
            elif w.task is not None and time.monotonic() - w.started > self.timeout_s:
                result = TaskResult(w.task, "timeout", seconds=time.monotonic() - w.started,
                                    error=f"no result after {self.timeout_s:.0f} s")
            if result is None:
                continue
            if result.status in ("crash", "timeout"):
                w.kill()
                self.workers[i] = self._spawn()
            else:
                w.task = None
            results.append(result)
        return results

    def imap_unordered(self, tasks: Iterable[Any]) -> Iterator[TaskResult]:
        """Yield one TaskResult per task, in completion order (``index`` = submit order)."""
        for t in tasks:
            self.submit(t)
        while self.outstanding:
            yield from self.poll()
