"""The package's errors. Library code raises a ``CutetuneError`` (or a subclass) for anything a
user can fix; only the command line (``cli.py``) turns them into one-line messages."""

from __future__ import annotations


class CutetuneError(Exception):
    """A mistake or condition the user can fix: bad input, a corrupt file, unreachable storage."""


class UserError(CutetuneError):
    """A command's arguments or inputs are wrong."""


class ArtifactError(CutetuneError, ValueError):
    """A model, heuristics or result file is unreadable, corrupt or of another format."""


class OutputError(CutetuneError, OSError):
    """An output cannot be written: a read-only place, a directory, or a full disk."""
