"""``trilm scaling``: fit scaling laws over results tables, compare families, write a report and plots.

Launch::

    trilm scaling fit runs/suite/results.csv --out runs/suite/scaling            # auto: what the data support
    trilm scaling fit a.csv b.json --form N --bootstrap 1000 --seed 0 --reference floatlm
    trilm scaling chinchilla --out outputs/chinchilla                            # reproduce Epoch AI's fit
    trilm scaling fit --law tissue --out fits/run run/logs/metrics.jsonl other-schedule.csv
    trilm scaling fit --law precision --out fits/suite runs/suite/results.csv
    trilm scaling predict fits/run/fit.json --schedule longer.csv --out fits/run/longer.json
    trilm scaling predict fits/suite/fit.json --params 1e8 1e9 --tokens 2e10 --bits 1.58

``fit --law NAME`` fits any law of the registry (:mod:`trilm.scaling.commands`). Without it, ``fit`` writes
``fit.json`` (parameters, intervals, residuals, comparisons), ``report.md`` and PNG + SVG plots
into ``--out`` (default: ``scaling/`` next to the first table).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from trilm.cli_options import add_bootstrap, add_size_axis
from trilm.config import require_directory_path
from trilm.scaling.analyse import analyse
from trilm.scaling.chinchilla import render_comparison, reproduce
from trilm.scaling.commands import fit_law_command, predict_command
from trilm.scaling.fitter import HUBER_DELTA
from trilm.scaling.laws import LAWS
from trilm.scaling.report_types import AnalysisConfig


def build_parser(parser: argparse.ArgumentParser, command: str = "scaling") -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="{fit,predict,chinchilla}")
    fit = sub.add_parser(
        "fit",
        help="fit L(N), L(D), L(N, D) over results tables; compare families; plot",
        description="Fit scaling laws (Chinchilla approach 3) over results tables.",
    )
    fit.add_argument(
        "tables",
        nargs="+",
        type=Path,
        metavar="TABLE",
        help="results tables (.csv, .json, .jsonl); with a curve --law, loss-curve tables (step, lr, loss)",
    )
    laws = ", ".join(f"{name} ({law.formula})" for name, law in LAWS.items())
    fit.add_argument(
        "--law",
        choices=list(LAWS),
        default=None,
        metavar="NAME",
        help=f"fit one law of the registry and write fit.json: {laws}",
    )
    fit.add_argument(
        "--loss",
        default="loss",
        help="with a curve --law: the loss column of the curve tables (default loss)",
    )
    fit.add_argument(
        "--form",
        choices=["auto", "N", "D", "ND"],
        default="auto",
        help="law to fit: N = L(N) per family (and vs bits), D = L(D) per run, ND = L(N, D) per"
        " family; auto fits what the data support and notes the rest (default)",
    )
    fit.add_argument(
        "--out", type=Path, default=None, help="output directory (default: <first table dir>/scaling)"
    )
    fit.add_argument("--eval", default="", help="evaluation name (default: val_loss, or the only one)")
    add_size_axis(fit, default="params", help="parameter axis of L(N) and L(N, D)")
    add_bootstrap(fit)
    fit.add_argument("--level", type=float, default=0.95, help="interval level")
    fit.add_argument("--reference", default="", help="family to compare with (default: floatlm)")
    fit.add_argument("--families", nargs="*", default=[], help="only these families")
    fit.add_argument(
        "--nd-points",
        choices=["final", "all"],
        default="final",
        help="L(N, D) on final checkpoints of runs (default) or all checkpoints",
    )
    fit.add_argument(
        "--d-from",
        type=float,
        default=0.0,
        help="L(D) along a run from this fraction of its tokens on (e.g. the end of warm-up; default 0)",
    )
    fit.add_argument("--no-loso", action="store_true", help="skip leave-one-size-out refits")
    fit.add_argument("--no-plots", action="store_true", help="skip the plots")
    fit.add_argument("--delta", type=float, default=HUBER_DELTA, help="Huber δ on log-loss residuals")

    pred = sub.add_parser(
        "predict",
        help="what a fit.json predicts: a curve along a schedule, or losses at sizes and budgets",
        description="Evaluate a fit written by `trilm scaling fit --law`, with its bootstrap interval.",
    )
    pred.add_argument("fit", type=Path, metavar="FIT", help="fit.json written by trilm scaling fit --law")
    pred.add_argument(
        "--schedule", type=Path, default=None, help="curve laws: a table of step, lr (CSV/JSONL)"
    )
    pred.add_argument("--params", type=float, nargs="+", default=None, help="size laws: parameter counts N")
    pred.add_argument("--tokens", type=float, nargs="+", default=None, help="size laws: training tokens D")
    pred.add_argument("--bits", type=float, nargs="+", default=None, help="precision law: bits per weight P")
    pred.add_argument(
        "--out", type=Path, default=None, help="predictions JSON (default: predictions.json by FIT)"
    )
    pred.add_argument("--no-plot", action="store_true", help="skip the plot (default: beside --out, .png)")

    chin = sub.add_parser(
        "chinchilla",
        help="reproduce Epoch AI's approach-3 fit of the Chinchilla data",
        description="Fit L(N, D) to Epoch AI's 240 Chinchilla points; compare with their estimates.",
    )
    chin.add_argument("--csv", type=Path, default=None, help="Epoch's chinchilla_svg_extracted_data.csv")
    chin.add_argument(
        "--out", type=Path, default=None, help="write fit.json, report.md, loss_nd.png/svg here"
    )
    add_bootstrap(chin, resamples=4000, seed=42, note="Epoch: 4000")


def run(args: argparse.Namespace) -> int:
    if args.action == "predict":
        return predict_command(args)
    if args.action == "fit" and args.law is not None:
        return fit_law_command(args)
    if args.action == "chinchilla":
        result = reproduce(args.csv, args.out, n_resamples=args.bootstrap, seed=args.seed)
        print(render_comparison(result))
        if args.out:
            print(f"wrote {args.out}/fit.json, report.md, loss_nd.png/svg")
        return 0
    cfg = AnalysisConfig(
        form=args.form,
        eval=args.eval,
        x=args.x,
        bootstrap=args.bootstrap,
        seed=args.seed,
        level=args.level,
        reference=args.reference,
        families=list(args.families),
        nd_points=args.nd_points,
        d_from=args.d_from,
        loso=not args.no_loso,
        plots=not args.no_plots,
        delta=args.delta,
    )
    out = args.out or args.tables[0].parent / "scaling"
    require_directory_path(out, "--out")
    report = analyse(args.tables, out, cfg)
    laws = [law for fa in report.families.values() for law in (fa.law_x, fa.law_nd) if law is not None]
    laws += list(report.run_fits.values())
    identified = sum(law.identified for law in laws)
    print(
        f"{len(laws)} fit(s) over {len(report.families)} famil{'y' if len(report.families) == 1 else 'ies'},"
        f" {identified} identified as laws (report.md lists the others and why); {len(report.notes)} note(s)"
    )
    for note in report.notes:
        print(f"  note: {note}")
    for name in sorted(report.files):
        print(f"wrote {report.files[name]}")
    return 0
