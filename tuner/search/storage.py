"""Optuna storages from a URL, with one-line errors, and what keeps a study that several
processes share sound when one of them dies.

URLs: ``journal:PATH`` (a file, no server), ``sqlite:///FILE`` (one host) and
``postgresql://...`` (many hosts; the psycopg driver of the ``fleet`` extra). Every one has
heartbeats: a process records one for each trial it holds, and any process fails a RUNNING
trial whose heartbeat is GRACE_HEARTBEATS intervals old (Optuna's RDB storage rule; its
journal storage has no heartbeats, so ``HeartbeatJournalStorage`` adds them). Locks are
kernel file locks (flock) or PostgreSQL session locks, which die with their holder: Optuna's
default journal lock, left behind by a killed process, makes the next one wait 30 s.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

import optuna
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.storages.journal._file import BaseJournalFileLock
from optuna.storages._heartbeat import BaseHeartbeat, is_heartbeat_enabled
from optuna.trial import TrialState

from ...errors import CutetuneError, UserError

GRACE_HEARTBEATS = 3  # a trial is stale after this many missed heartbeats
# User attribute: "host:pid" of the process holding a RUNNING trial, set after its first
# heartbeat. A RUNNING trial without it that is older than the grace period never had a
# heartbeat (a version without them, or a process killed before its first beat).
HOLDER_ATTR = "worker"
HEARTBEAT_ATTR = "cutetune:heartbeat"  # journal storage: time.time() of the last beat


class FileLock(BaseJournalFileLock):
    """An exclusive flock on ``path`` (created if missing), as Optuna's journal lock
    (acquire/release) or a context manager. The kernel drops it when its holder dies."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        self._threads = threading.Lock()  # flock is per open file: one holder per process
        self._file = None

    def acquire(self) -> bool:
        self._threads.acquire()
        try:
            f = open(self.path, "a")
            fcntl.flock(f, fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise
        self._file = f
        return True

    def release(self) -> None:
        f, self._file = self._file, None
        f.close()  # closing the file drops the lock
        self._threads.release()

    def __enter__(self) -> "FileLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class HeartbeatJournalStorage(optuna.storages.JournalStorage, BaseHeartbeat):
    """Optuna's journal storage with the heartbeats of its RDB storage: a beat is the trial's
    system attribute HEARTBEAT_ATTR (time.time() of the writing host)."""

    def __init__(self, path: Path, heartbeat_s: int, grace_s: float, stale_callback):
        self.append_lock = FileLock(f"{path}.append-lock")  # held while a record is written
        super().__init__(optuna.storages.journal.JournalFileBackend(
            str(path), lock_obj=self.append_lock))
        self.path = path
        self.heartbeat_s, self.grace_s, self.stale_callback = heartbeat_s, grace_s, stale_callback

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            self.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time())
        except UpdateFinishedTrialError:  # finished meanwhile: nothing to keep alive
            pass

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        now = time.time()
        return [t._trial_id for t in self.get_all_trials(study_id, deepcopy=False,
                                                         states=(TrialState.RUNNING,))
                if now - t.system_attrs.get(HEARTBEAT_ATTR, now) > self.grace_s]

    def get_heartbeat_interval(self) -> int:
        return self.heartbeat_s

    def get_heartbeat_stale_trial_callback(self):
        return self.stale_callback


def open_storage(url: str, heartbeat_s: int = 20,
                 max_retry: int = 3) -> optuna.storages.BaseStorage:
    """The storage behind ``url``. A stale trial (GRACE_HEARTBEATS missed heartbeats) is
    failed and, at most ``max_retry`` times, queued again (0: only failed). Raises
    CutetuneError with one line for a URL, file or server it cannot use."""
    grace_s = GRACE_HEARTBEATS * heartbeat_s
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        callback = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry)
    if url.startswith("journal:"):
        return _journal(Path(url[len("journal:"):]).expanduser(), heartbeat_s, grace_s, callback)
    shown = safe_url(url)
    if url.startswith("postgresql://"):
        # SQLAlchemy 2.0 maps a bare postgresql:// to psycopg2, 2.1 to psycopg (3): pin the
        # one the `fleet` extra installs.
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    dialect = url.split(":", 1)[0].split("+", 1)[0]
    if "://" not in url or dialect not in ("postgresql", "sqlite"):
        raise UserError(f"--storage must be journal:PATH or sqlite:///FILE (one host) or "
                        f"postgresql://... (many hosts), got {shown!r}")
    kwargs = ({"connect_args": {"timeout": 60}} if dialect == "sqlite" else
              {"pool_pre_ping": True, "connect_args": {"connect_timeout": 10}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        try:
            storage = optuna.storages.RDBStorage(
                url, engine_kwargs=kwargs, heartbeat_interval=heartbeat_s,
                grace_period=grace_s, heartbeat_stale_trial_callback=callback)
        except ImportError as e:
            if dialect == "postgresql":
                raise CutetuneError("a PostgreSQL storage needs the psycopg driver: "
                                    "pip install 'cutetune[fleet]'") from None
            raise CutetuneError(f"cannot open storage {shown}: {e}") from None
        except Exception as e:  # sqlalchemy/psycopg raise many types for a bad server or URL
            raise CutetuneError(f"cannot open storage {shown}: {_first_line(e)}") from None
    if dialect == "sqlite":
        # Write-ahead log, synced at checkpoints: a commit costs no fsync, and readers do not
        # block the writer (a trial takes about six commits).
        from sqlalchemy import event

        @event.listens_for(storage.engine, "connect")
        def _pragmas(conn, _record):
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")

        storage.engine.dispose()  # connections opened so far lack the pragmas
    return storage


def _journal(path: Path, heartbeat_s: int, grace_s: float, callback) -> HeartbeatJournalStorage:
    if path.is_dir():
        raise CutetuneError(f"journal storage {path} is a directory; name a file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_file():  # Optuna reads a line that is not a log only when one follows it
            with open(path, "rb") as f:
                first = f.readline()
            if first and not isinstance(json.loads(first), dict):
                raise ValueError("its first line is not a journal entry")
        return HeartbeatJournalStorage(path, heartbeat_s, grace_s, callback)
    except OSError as e:
        raise CutetuneError(f"cannot open journal storage {path}: {e.strerror or e}") from None
    except Exception as e:  # the replay of a file that is no journal fails in many ways
        raise CutetuneError(f"{path} is not an Optuna journal file ({_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def safe_url(url: str) -> str:
    """``url`` without its password (one can only come before an "@")."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparsable URL>" if "@" in url else url


# ---------------------------------------------------------------- sharing a study
@contextmanager
def study_lock(storage: optuna.storages.BaseStorage, name: str):
    """Serialize a critical section on study ``name`` across processes and hosts: a
    PostgreSQL session advisory lock, or a file lock beside an SQLite or journal file (both
    released if the holder dies); nothing for an in-memory storage (one process)."""
    if isinstance(storage, HeartbeatJournalStorage):
        path = f"{storage.path}.study-lock"
    elif isinstance(storage, optuna.storages.RDBStorage):
        engine = storage.engine
        if engine.dialect.name == "postgresql":
            from sqlalchemy import text

            key = int.from_bytes(hashlib.sha256(f"cutetune:{name}".encode()).digest()[:8],
                                 "big", signed=True)
            with engine.connect() as conn:
                conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
                try:
                    yield
                finally:
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            return
        db = engine.url.database
        path = f"{db}.lock" if db and db != ":memory:" else None
    else:
        path = None
    if path is None:
        yield
        return
    with FileLock(path):
        yield


def holder_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Heartbeat(threading.Thread):
    """Records a heartbeat every ``interval`` seconds for each trial id in ``held`` (which
    its owner updates as it takes and finishes trials)."""

    def __init__(self, storage, held: dict, interval: float):
        super().__init__(daemon=True)
        self.storage, self.held, self.interval = storage, held, interval
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            for tid in list(self.held):
                try:
                    self.storage.record_heartbeat(tid)
                except Exception as e:  # a database hiccup: the next beat may succeed
                    print(f"cutetune: heartbeat of trial {tid} failed: {e}", file=sys.stderr)


def shared(study: optuna.Study) -> bool:
    """Whether ``study`` lives in a storage with heartbeats (one other processes may share)."""
    return is_heartbeat_enabled(study._storage)


def fail_stale_trials(study: optuna.Study) -> None:
    """Fail the RUNNING trials of processes that are gone: Optuna's heartbeat rule (with the
    storage's retry callback), and a trial that never recorded its holder (HOLDER_ATTR) and
    started more than the grace period ago."""
    storage = study._storage
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    grace = timedelta(seconds=GRACE_HEARTBEATS * storage.get_heartbeat_interval())
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if HOLDER_ATTR not in t.user_attrs and t.datetime_start is not None and \
                datetime.now() - t.datetime_start > grace:
            try:
                storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
            except UpdateFinishedTrialError:
                pass
