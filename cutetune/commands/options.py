"""Option types shared by the subcommands: counts and times that must be in bounds, refused
while parsing with one line naming the option (``cli.main`` prints it)."""

from __future__ import annotations

import argparse

from ..errors import UserError


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
