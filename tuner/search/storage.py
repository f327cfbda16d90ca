"""Optuna storages from a URL, with one-line errors: ``journal:PATH`` (a file, no server),
``sqlite:///FILE`` and ``postgresql://...`` (the fleet's, with heartbeats)."""

from __future__ import annotations

import warnings

import optuna
from optuna.exceptions import ExperimentalWarning


GRACE_HEARTBEATS = 3  # a trial is stale after this many missed heartbeats


def open_storage(url: str, heartbeat_s: int = 20, max_retry: int = 3) -> optuna.storages.RDBStorage:
    """An RDB storage whose RUNNING trials are failed and re-enqueued (at most ``max_retry``
    times) once their heartbeat is GRACE_HEARTBEATS intervals old."""
    if url.startswith("postgresql://"):
        # SQLAlchemy 2.0 maps a bare postgresql:// to psycopg2, 2.1 to psycopg (3): pin the
        # one the `fleet` extra installs.
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    dialect = url.split(":", 1)[0].split("+", 1)[0]
    if dialect not in ("postgresql", "sqlite"):
        raise ValueError(f"--storage must be postgresql://... (many hosts) or sqlite:///FILE "
                         f"(one host), got a {dialect!r} URL")
    kwargs = ({"connect_args": {"timeout": 60}} if dialect == "sqlite" else
              {"pool_pre_ping": True, "connect_args": {"connect_timeout": 10}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        try:
            storage = optuna.storages.RDBStorage(
                url, engine_kwargs=kwargs, heartbeat_interval=heartbeat_s,
                grace_period=GRACE_HEARTBEATS * heartbeat_s,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                    max_retry=max_retry))
        except ImportError:
            raise ValueError("a PostgreSQL storage needs the psycopg driver: "
                             "pip install 'cutetune[fleet]'") from None
        except Exception as e:  # sqlalchemy/psycopg raise many types for a bad server or URL
            raise ValueError(f"cannot open storage {safe_url(url)}: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}") from None
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


def safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparsable URL>"
