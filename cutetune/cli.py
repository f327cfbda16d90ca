"""The `cutetune` command: assembles the subcommands of ``commands/`` and turns the package's
errors into one clear line instead of a traceback. Subcommand modules import only what their
parsers need, so ``cutetune --help`` answers without importing torch, quack or xgboost."""

from __future__ import annotations

import argparse
import importlib
import sys

from .errors import CutetuneError, UserError

# subcommand -> module defining `register(subparsers)`; each register adds its parser and sets
# `func` to a callable taking the parsed args and returning an exit code.
SUBCOMMANDS = ("space", "collect", "train", "predict", "tune", "emit", "fleet", "prebuild")


def _bounded(kind: type, minimum: float, inclusive: bool) -> type[argparse.Action]:
    class Bounded(argparse.Action):
        """Stores the option's value (converted by ``kind``) if it is within bounds, else
        refuses it with one line that names the option (printed by ``main``)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{"type": kind, **kwargs})

        def __call__(self, parser, namespace, value, option_string=None):
            if not (value >= minimum if inclusive else value > minimum):  # also refuses nan
                raise UserError(f"{option_string} must be {'>=' if inclusive else '>'} "
                                f"{minimum}, got {value}")
            setattr(namespace, self.dest, value)

    return Bounded


def at_least(minimum: float, kind: type = int) -> type[argparse.Action]:
    """An argparse action for a count (or time) that must be at least ``minimum``:
    ``add_argument("--trials", action=at_least(1))``."""
    return _bounded(kind, minimum, inclusive=True)


def more_than(minimum: float, kind: type = float) -> type[argparse.Action]:
    """An argparse action for a time (or number) that must exceed ``minimum``."""
    return _bounded(kind, minimum, inclusive=False)


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
    except CutetuneError as e:  # an option's value refused by its action (_bounded)
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
