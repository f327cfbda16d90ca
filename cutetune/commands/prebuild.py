"""`cutetune prebuild`: build the fused SwiGLU kernels' TVM-FFI libraries without a GPU
(``tuner/kernels/prebuild.py``)."""

from __future__ import annotations

import json
from pathlib import Path

from ..artifacts import check_writable
from .options import at_least, more_than
from ..models.heuristics import Heuristics, default_path
from ..tuner.kernels import aot


def register(sub) -> None:
    p = sub.add_parser("prebuild", help="build the fused SwiGLU kernels' libraries (no GPU)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--heuristics", help="heuristics file (default: the packaged sm90 bf16 one)")
    p.add_argument("--workers", action=at_least(1), help="compile processes (default: cores - 1)")
    p.add_argument("--timeout-s", action=more_than(0), default=1800.0)
    p.add_argument("--package", type=Path, metavar="ZIP",
                   help=f"also write the kernels' object files there (cutetune ships "
                        f"{aot.PACKAGE.name})")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from ..tuner.kernels.prebuild import prebuild  # imports torch: not for the parser

    h = Heuristics.load(args.heuristics or default_path("sm90", "bf16"))
    if args.package:  # written after the builds: refused now if it cannot be
        check_writable(args.package, "kernel package")
        aot.read_package(args.package)
    summary = prebuild(h, args.workers, args.timeout_s, args.package)
    print(json.dumps(summary))
    return 0 if summary["built"] == summary["kernels"] else 1
