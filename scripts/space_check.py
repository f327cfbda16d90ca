"""Reproduce data/space_check/<arch>_full.json.gz: compile every valid kernel of an arch on this
CPU (no GPU), plus rule-rejected grid points as evidence for the rules.

    python scripts/space_check.py sm90 [extra `cutetune space check` options]

Thin wrapper over `cutetune space check`; it only fixes the arguments of the committed runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cutetune.cli import main

REJECTED = 120  # rule-rejected grid points compiled next to the valid space
WORKERS = 2

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("sm90", "sm100"):
        sys.exit("usage: python scripts/space_check.py sm90|sm100 [cutetune space check options]")
    arch = sys.argv[1]
    out = Path(__file__).resolve().parent.parent / "data" / "space_check" / f"{arch}_full.json.gz"
    sys.exit(main(["space", "check", "--arch", arch, "--workers", str(WORKERS),
                   "--rejected", str(REJECTED), "--out", str(out), *sys.argv[2:]]))
