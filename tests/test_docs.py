"""The README and docs/ say what the code and the tree hold: the settings table lists every
variable of cutetune/settings.py with its default, the README's commands name scripts that
exist, and docs/reproduce.md names every committed result file."""

from __future__ import annotations

import fnmatch
import itertools
import re
from pathlib import Path

from cutetune.settings import VARIABLES

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def test_the_readme_settings_table_is_settings_variables():
    rows = re.findall(r"^\| `([A-Z_]+)` \| (.*?) \| (.*?) \|$", README, re.M)
    assert [name for name, _, _ in rows] == list(VARIABLES)
    for name, default, _ in rows:
        assert default.strip("`") == VARIABLES[name][0], name


def test_the_readme_and_docs_name_scripts_that_exist():
    texts = [README, *(p.read_text() for p in (REPO / "docs").glob("*.md"))]
    named = {m for t in texts for m in re.findall(r"scripts/([\w.]+\.(?:py|sh))", t)}
    first_cells = re.findall(r"^\| ([^|]*) \|", (REPO / "docs" / "reproduce.md").read_text(), re.M)
    removed = {m for cell in first_cells for m in re.findall(r"`([\w.]+\.(?:py|sh))`", cell)}
    missing = {s for s in named - removed if not (REPO / "scripts" / s).is_file()}
    assert not missing, missing


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
