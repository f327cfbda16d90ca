"""The `cutetune` command: assembles the subcommands of ``commands/`` and turns the package's
errors into one clear line instead of a traceback. Subcommand modules import only what their
parsers need, so ``cutetune --help`` answers without importing torch, quack or xgboost."""

from __future__ import annotations

import argparse
import importlib
import sys

from .errors import CutetuneError

# subcommand -> module defining `register(subparsers)`; each register adds its parser and sets
# `func` to a callable taking the parsed args and returning an exit code.
SUBCOMMANDS = ("space", "collect", "train", "predict", "tune", "emit", "fleet", "prebuild")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cutetune",
        description="ML-guided autotuner for CuteDSL (quack) GEMM kernels: search space, "
        "GPU measurement, cost model, tuning and torch.compile integration.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"{__package__}.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parser.parse_args(argv)
    except CutetuneError as e:  # an option's value refused by its action (commands/options.py)
        command = next((a for a in argv if a in SUBCOMMANDS), None)
        print(f"cutetune{' ' + command if command else ''}: error: {e}", file=sys.stderr)
        return 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (CutetuneError, FileNotFoundError, ValueError) as e:
        print(f"cutetune {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"cutetune {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
