"""The part of Inductor's FX-graph cache key that says which cutetune code made a graph's
choices: a graph compiled by other cutetune code (an edited checkout, another release of the
same version string) is compiled again rather than reloaded with that code's choices."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from ... import models, space
from .. import kernels

# What decides what a node's generated code calls: the pure rules (space/), the model readers
# (models/: the heuristics file's and the Triton table's, and the grouped cost model that the
# grouped GEMM pass runs at compile time), the kernels' support envelope and runtime
# (tuner/kernels/) and this package. Folders are walked, so a new module is covered as added.
_FOLDERS = (Path(space.__file__).parent, Path(models.__file__).parent,
            Path(kernels.__file__).parent, Path(__file__).parent)


def decision_sources() -> list[Path]:
    """The source files hashed, in a fixed order."""
    files = {f.resolve() for folder in _FOLDERS for f in folder.rglob("*.py")}
    return sorted(files)


@lru_cache(maxsize=None)
def decision_code_digest() -> str:
    h = hashlib.sha256()
    for f in decision_sources():
        h.update(f"{f.parent.name}/{f.name}\0".encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]
