"""The `cutetune` command. Each subcommand lives beside the code it drives; this module only
assembles them and turns user mistakes into one clear line instead of a traceback."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module that defines `register(subparsers)`; each register adds its parser and
# sets `func` to a callable taking the parsed args and returning an exit code.
SUBCOMMANDS = {
    "space": "cutetune.space.cli",
    "collect": "cutetune.tuner.collect",
    "train": "cutetune.models.train",
    "predict": "cutetune.models.predict",
    "tune": "cutetune.tuner.tune",
    "emit": "cutetune.tuner.heuristics",
    "fleet": "cutetune.tuner.fleet",
    "prebuild": "cutetune.tuner.prebuild",
}


class UserError(Exception):
    """Raised for a mistake the user can fix; printed without a traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cutetune",
        description="ML-guided autotuner for CuteDSL (quack) GEMM kernels: search space, "
        "GPU measurement, cost model, tuning and torch.compile integration.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in SUBCOMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("cutetune"):
                continue  # subcommand not built yet
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from cutetune.dataset import DatasetError
    from cutetune.space.problem import ProblemError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (UserError, ProblemError, DatasetError, FileNotFoundError, ValueError) as e:
        print(f"cutetune {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
