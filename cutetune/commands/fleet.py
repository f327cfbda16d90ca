"""`cutetune fleet` (status, export) and the fleet options of `cutetune collect`."""

from __future__ import annotations

import json

import optuna

from .options import at_least
from ..tuner.measure.collect import CHUNK
from ..tuner.search.storage import GRACE_HEARTBEATS, open_storage
from ..tuner.fleet.queue import _study
from ..tuner.fleet.run import export, status

def requested(args) -> bool:
    """Whether a collect command asks for fleet mode."""
    return bool(args.storage) or args.workers is not None or args.backend != "gpu"


def add_arguments(p) -> None:
    """The fleet options of `cutetune collect`."""
    g = p.add_argument_group(
        "fleet", "Given --storage or --workers, work items queue in an Optuna study; every host "
        "running the same command shares them, and the run ends by exporting the study to --out.")
    g.add_argument("--storage", default=None, metavar="URL",
                   help="Optuna RDB storage: postgresql://USER@HOST/DB for many hosts, "
                        "sqlite:///FILE for one (default with --workers: an SQLite file in the "
                        "cutetune cache folder)")
    g.add_argument("--workers", action=at_least(1), default=None, metavar="N",
                   help="worker processes on this host, worker i pinned to visible GPU i mod "
                        "count (default: one per visible GPU; 1 for a replay backend)")
    g.add_argument("--study", default=None,
                   help="study name (default: derived from the problems, configs, arch, dtype "
                        "and seed)")
    g.add_argument("--backend", default="gpu",
                   help="gpu, or replay:PATH to answer items from a recorded dataset (no GPU)")
    g.add_argument("--replay-delay", action=at_least(0, float), default=0.0, metavar="S",
                   help="replay backend: seconds each item takes")
    g.add_argument("--item-size", action=at_least(1), default=CHUNK, metavar="N",
                   help="most configs in one work item (default %(default)s)")
    g.add_argument("--heartbeat", action=at_least(1), default=20, metavar="S",
                   help=f"seconds between a worker's heartbeats; a trial whose worker missed "
                        f"{GRACE_HEARTBEATS} is failed and queued again (default %(default)s)")
    g.add_argument("--max-retry", action=at_least(0), default=3,
                   help="times one item is queued again after its worker died (default 3)")


def register(sub) -> None:
    p = sub.add_parser("fleet", help="status and export of a fleet collection study",
                       description=__doc__.split("\n\n")[0])
    fsub = p.add_subparsers(dest="fleet_command", metavar="ACTION", required=True)
    for action, help_ in (("status", "items by state"),
                          ("export", "append the study's measurements to a dataset")):
        a = fsub.add_parser(action, help=help_)
        a.add_argument("--storage", required=True, metavar="URL")
        a.add_argument("--study", required=True)
        if action == "export":
            a.add_argument("--out", required=True, help="dataset folder")
        a.set_defaults(func=_run_action)


def _run_action(args) -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = _study(open_storage(args.storage), args.study, create=False)
    if args.fleet_command == "status":
        print(json.dumps(status(study)))
    else:
        print(json.dumps(export(study, args.out)))
    return 0
