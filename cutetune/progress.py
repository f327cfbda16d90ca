"""Progress bars for the long commands (collect, space check, emit, train): tqdm on stderr, so
stdout keeps only results.

On a terminal the bar redraws in place. Anywhere else (CI, pipes, the GPU host's logs) it is
off (tqdm's ``disable=None``): a bar written to a file is one line of carriage returns that
grows for the whole run, which ``tail`` shows as one unreadable line. A command with something
worth logging there checks ``bar.disable`` and prints plain lines instead.
"""

from __future__ import annotations

import sys

from tqdm import tqdm


def bar(total: int | None, desc: str, *, unit: str = "it", quiet: bool = False,
        **options) -> tqdm:
    """A tqdm bar on stderr, off with ``quiet`` or when stderr is not a terminal; ``options``
    go to tqdm. Write a line above it with ``bar.write(text, file=sys.stderr)``."""
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                disable=True if quiet else None, **options)
