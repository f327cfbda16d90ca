"""`cutetune train`: train and evaluate the cost model on a dataset, write the model file and
its report (``models/train.py``). A model ranks one kind of problem, dense or grouped GEMMs:
the dataset's kind, or ``--kind`` where it holds both."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..artifacts import check_writable, check_writable_dir
from ..errors import UserError
from ..models.artifact import CostModel
from ..models.data import Measurements, dataset_sha256, load_measurements
from ..models.dataset import DatasetError
from ..models.fallback import OBJECTIVES
from ..models.kinds import KINDS
from ..models.methods import missing_baseline_packages
from ..models.train import KIND_DEFAULTS, Evaluation, TrainOptions, train
from .options import at_least


def run(dataset: str | os.PathLike, out: str | os.PathLike, report_dir: str | os.PathLike | None,
        options: TrainOptions, kind: str | None = None, also: str | os.PathLike | None = None
        ) -> tuple[CostModel, Evaluation]:
    """Train on a dataset folder's problems of ``kind`` (None: its only kind), write the model
    file and (when asked) the report. ``also``: a dataset folder of the same device in another
    dtype whose dense problems join every fit (``train``'s ``extra``). Both outputs are checked
    writable first: training takes minutes to hours."""
    from ..models.report import write_report

    check_writable(out, "model file")
    if report_dir is not None:
        check_writable_dir(report_dir, "report folder")
    data, digest = _read(dataset, kind)
    extra, extra_digest = None, None
    if also is not None:
        if data.kind.name != "dense":
            raise UserError(f"--also joins another dtype's data to a dense model's fits; "
                            f"these are {data.kind.name} problems")
        try:
            extra, extra_digest = _read(also, "dense")
        except (DatasetError, FileNotFoundError) as e:
            raise type(e)(f"--also {also}: {e}") from e
    missing = missing_baseline_packages(data.kind) if options.baselines else []
    if missing:
        raise UserError(f"the baselines need {', '.join(missing)}: pip install -e "
                        f"\".[baselines]\", or train with --no-baselines")
    model, ev = train(data, options, extra)
    model.metadata["trained_on"]["dataset"] = str(dataset)
    model.metadata["trained_on"]["sha256"] = digest
    if extra is not None:
        model.metadata["trained_on"]["extra"].update(dataset=str(also), sha256=extra_digest)
    path = model.save(out)
    print(f"wrote {path} ({ev.kind} GEMMs, {ev.chosen}, {ev.problems} problems, {ev.rows} rows)")
    if report_dir is not None:
        print(f"wrote {write_report(ev, Path(report_dir), model.metadata)}")
    s = ev.cv_summary[ev.chosen]["all"]
    print(f"held-out ({options.folds}-fold CV): top-1 geomean {s['top1_geomean']:.3f}, "
          f"P10 {s['top1_p10']:.3f}, best-of-top-5 {s['top5_geomean']:.3f}, "
          f"vs {model.kind.baseline} {s['vs_cublas_geomean']:.3f}x")
    return model, ev


def _read(dataset: str | os.PathLike, kind: str | None) -> tuple[Measurements, str]:
    """A dataset folder's measurements of ``kind`` and the digest of the parts they came from."""
    digest = dataset_sha256(dataset)
    data = load_measurements(dataset, kind)
    if dataset_sha256(dataset) != digest:
        raise DatasetError(f"dataset {dataset} changed while it was read; run again")
    return data, digest


def add_arguments(p: argparse.ArgumentParser, dataset: str | None = None, out: str | None = None,
                  report: str | None = None, also: str | None = None) -> None:
    """The train options; ``dataset``/``out``/``report`` given make those arguments optional,
    ``also`` is the default of --also."""
    d = TrainOptions()
    p.add_argument("dataset", nargs="?" if dataset else None, default=dataset,
                   help="dataset folder of Parquet parts (cutetune collect output)"
                        + (f" (default {dataset})" if dataset else ""))
    p.add_argument("--kind", choices=tuple(KINDS),
                   help="which problems to train on when the dataset holds both dense and "
                        "grouped (MoE expert) GEMMs (default: its only kind)")
    p.add_argument("--out", required=out is None, default=out, help="model file to write (JSON)"
                   + (f" (default {out})" if out else ""))
    p.add_argument("--report", metavar="DIR", default=report,
                   help="write the evaluation report here" + (f" (default {report})" if report else ""))
    p.add_argument("--folds", type=int, default=d.folds)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--trees", action=at_least(1), default=d.n_estimators)
    p.add_argument("--depth", action=at_least(1), default=d.max_depth)
    p.add_argument("--objectives",
                   help="XGBoost objectives to try, comma-separated (regression is always kept: "
                        "it is the time model; default: the kind's, " + "; ".join(
                            f"{k} {','.join(v.objectives)}" for k, v in KIND_DEFAULTS.items()) + ")")
    p.add_argument("--no-baselines", action="store_true", help="skip the baseline methods")
    p.add_argument("--no-family-out", action="store_true",
                   help="skip the leave-one-family-out evaluation")
    p.add_argument("--fallback-quantile", type=float, default=d.fallback_quantile,
                   help="quantile of the ATen fallback, a classifier's threshold (default: the kind's, "
                        + ", ".join(f"{k} {v.fallback_quantile:g}" for k, v in KIND_DEFAULTS.items())
                        + ")")
    p.add_argument("--fallback-objective", choices=OBJECTIVES, default=d.fallback_objective,
                   help="the ATen fallback's model: a calibrated quantile of the pick's slowdown, "
                        "or a classifier whose P(pick faster) must exceed --fallback-quantile "
                        "(default: the kind's, " + ", ".join(
                            f"{k} {v.fallback_objective}" for k, v in KIND_DEFAULTS.items()) + ")")
    p.add_argument("--timer-weight", type=float, default=d.timer_weight,
                   help="add this times the time model's log time to a ranking objective's "
                        "score, a blend tried beside each ranker (0: none; default: the kind's, "
                        + ", ".join(f"{k} {v.timer_weight:g}" for k, v in KIND_DEFAULTS.items())
                        + ")")
    p.add_argument("--threads", type=int, default=d.threads, help="threads per model fit")
    p.add_argument("--also", metavar="DATASET", default=also,
                   help="a dataset of the same GPU in another dtype whose dense problems join "
                        "every fit, never scored: a held-out fold's fit leaves out its layers"
                        + (f" (default {also}; 'none' for none)" if also else ""))


def options_from(args: argparse.Namespace) -> TrainOptions:
    objectives = None if args.objectives is None else tuple(dict.fromkeys(
        ["regression"] + [o.strip() for o in args.objectives.split(",") if o.strip()]))
    if args.fallback_quantile is not None and not 0.0 < args.fallback_quantile < 1.0:
        raise ValueError(f"--fallback-quantile must be in (0, 1), got {args.fallback_quantile}")
    if args.timer_weight is not None and not args.timer_weight >= 0.0:
        raise ValueError(f"--timer-weight must be >= 0, got {args.timer_weight}")
    return TrainOptions(folds=args.folds, seed=args.seed, n_estimators=args.trees,
                        max_depth=args.depth, objectives=objectives,
                        baselines=not args.no_baselines, family_out=not args.no_family_out,
                        fallback_quantile=args.fallback_quantile,
                        fallback_objective=args.fallback_objective,
                        timer_weight=args.timer_weight, threads=args.threads)


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="train and evaluate the cost model on a dataset")
    add_arguments(p)
    p.set_defaults(func=_main)


def also_from(args: argparse.Namespace) -> str | None:
    """--also's dataset: None for none, also where the default names one ("none")."""
    return None if args.also in (None, "none") else args.also


def _main(args: argparse.Namespace) -> int:
    run(args.dataset, args.out, args.report, options_from(args), args.kind, also_from(args))
    return 0
