"""docs/ says what the tree holds: docs/reproduce.md names every committed result file."""

from __future__ import annotations

import fnmatch
import itertools
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _braces(pattern: str) -> list[str]:
    """``a{x,y}b`` -> ``axb``, ``ayb`` (as the shell expands them)."""
    parts = re.split(r"\{([^{}]*)\}", pattern)
    options = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*options)]


def reproduce_patterns() -> list[str]:
    """The paths and globs of docs/reproduce.md's tables: every backticked ``data/...`` that is
    not a bare folder, and every bare file name after one in its row, in that one's folder."""
    out = []
    for line in (REPO / "docs" / "reproduce.md").read_text().splitlines():
        if not line.startswith("|"):
            continue
        folder = None
        for token in re.findall(r"`([^`\s]+)`", line):
            if token.startswith("data/") and not token.endswith("/"):
                folder = token.rsplit("/", 1)[0]
                out.extend(_braces(token))
            elif folder and "/" not in token:
                out.extend(p for p in _braces(f"{folder}/{token}") if re.search(r"\.\w+$", p))
    return out


def test_reproduce_names_every_committed_data_file():
    patterns = reproduce_patterns()
    files = [str(f.relative_to(REPO)) for f in (REPO / "data").rglob("*") if f.is_file()]
    unnamed = [f for f in files if not any(fnmatch.fnmatchcase(f, p) for p in patterns)]
    assert not unnamed, unnamed
