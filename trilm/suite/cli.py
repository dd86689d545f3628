"""``trilm suite``: define, plan, launch, monitor and analyse a suite of runs (families × sizes × budgets).

    trilm suite plan spectra                          # per run: params, FLOPs, steps, GPUs, GPU-hours, disk
    trilm suite plan spectra --device V100 --mfu 0.5  # priced on other hardware
    trilm suite launch minisuite --local              # train here, one run after another (rerun = resume)
    trilm suite launch spectra --slurm [--dry-run]    # one SLURM array per node shape, one task per run
    trilm suite launch spectra --hostfile hosts       # DeepSpeed launcher over a hostfile, run by run
    trilm suite status minisuite                      # state, step, tokens, checkpoints, losses, ETA
    trilm suite analyse minisuite                     # results table → fits, family comparison → report
    trilm suite cooldown cooldown --at 0.25,0.5,1.0 --fraction 0.2   # cooldown branches of WSD runs
    trilm suite convert SUITE                         # its conversions: float runs continued as TriLMs

SUITE is a name in ``configs/suites/`` or a path to a suite YAML (``docs/suites.md``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from trilm.cli_options import add_bootstrap, add_no_progress, add_size_axis
from trilm.config import ConfigError
from trilm.suite import launch
from trilm.suite.analyse import analyse_suite, other_notes, summary_text
from trilm.suite.config import load_suite
from trilm.suite.convert import analyse_conversions, conversion_branches
from trilm.suite.cooldown import branch_records, cooldown_branches, render_branches, run_cooldown
from trilm.suite.plan import plan_suite
from trilm.suite.predicted import FORECAST_FROM, text_lines
from trilm.suite.status import add_forecasts, render_status, suite_status
from trilm.suite.sweep import parse_axes, sweep


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "suite", metavar="SUITE", help="suite name (configs/suites/NAME.yaml) or a suite YAML path"
    )
    p.add_argument(
        "--run-dir", default=None, help="directory of the suite's runs (default: the suite's root)"
    )
    p.add_argument(
        "--families",
        default="",
        help="comma-separated families (default: the suite's non-optional ones, e.g. without BiLM)",
    )


def build_parser(parser: argparse.ArgumentParser, command: str = "suite") -> None:
    sub = parser.add_subparsers(
        dest="action", required=True, metavar="{plan,launch,status,analyse,sweep,cooldown,convert}"
    )
    plan = sub.add_parser("plan", help="per-run cost: params, FLOPs, tokens, steps, GPUs, GPU-hours, disk")
    _common(plan)
    plan.add_argument("--device", default=None, help="price on this device (H100, H200, A100, V100, …)")
    plan.add_argument("--mfu", type=float, default=None, help="model FLOPs utilisation to price at")
    plan.add_argument("--markdown", action="store_true", help="print the table as markdown")

    launch = sub.add_parser("launch", help="train locally, or write/submit launch scripts (idempotent)")
    _common(launch)
    mode = launch.add_mutually_exclusive_group()
    mode.add_argument("--local", action="store_true", help="train here, one run after another (default)")
    mode.add_argument("--slurm", action="store_true", help="one SLURM array per node shape (sbatch)")
    mode.add_argument("--hostfile", type=Path, default=None, metavar="F", help="DeepSpeed hostfile")
    launch.add_argument("--dry-run", action="store_true", help="write configs and scripts; run nothing")
    launch.add_argument("--runs", default="", help="comma-separated run names (default: all)")
    launch.add_argument("--force", action="store_true", help="start runs that look like they are running")
    launch.add_argument(
        "--sbatch",
        action="append",
        default=[],
        metavar="ARG",
        help="extra #SBATCH line, e.g. --partition=gpu",
    )
    add_no_progress(launch)
    launch.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="--local: train this many runs at once, each a single-threaded process (CPU suites)",
    )

    status = sub.add_parser("status", help="per run: state, step, tokens, checkpoints, losses, tokens/s, ETA")
    _common(status)
    status.add_argument(
        "--stale-after",
        type=float,
        default=900.0,
        help="for run directories without a lock file: seconds without metrics before a run is 'stopped'",
    )
    status.add_argument("--json", action="store_true", help="print JSON instead of the table")

    sweep = sub.add_parser(
        "sweep", help="tune the learning rate (and other keys) per family and size, before launching"
    )
    _common(sweep)
    sweep.add_argument(
        "--size", required=True, help="the suite's size(s) to sweep at, e.g. mini or 64x2,96x3"
    )
    sweep.add_argument("--lr", required=True, help="comma-separated peak learning rates, e.g. 2e-3,4e-3,8e-3")
    sweep.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="another grid axis over a run-config key, e.g. batch_tokens=1024,4096 (repeatable)",
    )
    sweep.add_argument(
        "--tokens", type=float, default=None, help="training tokens of every sweep run (default: the suite's)"
    )
    sweep.add_argument("--dry-run", action="store_true", help="write the configs; train nothing")
    sweep.add_argument("--jobs", type=int, default=1, help="train this many runs at once (single-threaded)")
    add_no_progress(sweep)

    cool = sub.add_parser(
        "cooldown",
        help="cooldown branches of the suite's WSD runs: each ends at a fraction of its parent's budget",
    )
    _common(cool)
    cool.add_argument(
        "--at",
        default="",
        help="comma-separated fractions of the parent's budget where branches end, e.g. 0.25,0.5,1.0"
        " (default: the suite's cooldown.at)",
    )
    cool.add_argument(
        "--fraction",
        type=float,
        default=None,
        help="the cooldown's share of each branch's length (default: the suite's cooldown.fraction)",
    )
    cool.add_argument("--shape", choices=["1-sqrt", "linear"], default=None, help="cooldown shape")
    cool.add_argument("--runs", default="", help="comma-separated parent runs (default: all)")
    cool.add_argument("--dry-run", action="store_true", help="write the branch configs; train nothing")
    cool.add_argument("--force", action="store_true", help="start branches that look like they are running")
    cool.add_argument(
        "--jobs", type=int, default=1, help="train this many branches at once (single-threaded)"
    )
    add_no_progress(cool)

    conv = sub.add_parser(
        "convert",
        help="conversion branches of the suite's float runs (its conversions section): each continues as"
        " a TriLM or BiLM to the end of its parent's budget",
    )
    _common(conv)
    conv.add_argument("--runs", default="", help="comma-separated parent runs (default: all)")
    conv.add_argument("--dry-run", action="store_true", help="write the branch configs; train nothing")
    conv.add_argument("--force", action="store_true", help="start branches that look like they are running")
    conv.add_argument(
        "--jobs", type=int, default=1, help="train this many branches at once (single-threaded)"
    )
    add_no_progress(conv)

    for name in ("analyse", "analyze"):
        ana = sub.add_parser(
            name,
            help="checkpoints → results table → scaling fits, family comparison → report"
            if name == "analyse"
            else argparse.SUPPRESS,
        )
        _common(ana)
        ana.add_argument("--out", type=Path, default=None, help="output directory (default: ROOT/analysis)")
        add_bootstrap(ana)
        ana.add_argument("--no-plots", action="store_true", help="skip the plots")
        add_size_axis(
            ana, default=None, help="size axis of L(N) (default: the suite's analysis.x, else params)"
        )
        ana.add_argument(
            "--forecast-from",
            type=float,
            default=None,
            metavar="F",
            help="share of each finished run whose checkpoints its final-loss forecast is made from"
            " (default: 0.5)",
        )


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def run(args: argparse.Namespace) -> int:
    suite = load_suite(args.suite, families=_split(args.families) or None, root=args.run_dir)
    if args.action == "plan":
        if args.device or args.mfu:
            hw = suite.config.hardware
            hw = hw.replace(device=args.device or hw.device, mfu=args.mfu or hw.mfu)
            if args.device:
                hw = hw.replace(peak_tflops=0.0)
            suite.config = suite.config.replace(hardware=hw)
        print(plan_suite(suite).render(markdown=args.markdown))
        return 0
    if args.action == "launch":
        runs = launch.cheapest_first(suite.runs)
        if args.runs:
            runs = [suite.run(name) for name in _split(args.runs)]
        if args.slurm:
            outcomes = launch.launch_slurm(
                suite, runs, dry_run=args.dry_run, force=args.force, sbatch_args=args.sbatch
            )
        elif args.hostfile is not None:
            outcomes = launch.launch_hostfile(
                suite, runs, args.hostfile, dry_run=args.dry_run, force=args.force
            )
        else:
            outcomes = launch.launch_local(
                suite,
                runs,
                dry_run=args.dry_run,
                progress=not args.no_progress,
                force=args.force,
                jobs=args.jobs,
            )
        failed = [o for o in outcomes if o.action == "failed"]
        print(f"suite {suite.name}: {len(outcomes)} runs; " + _count(outcomes))
        return 1 if failed else 0
    if args.action == "sweep":
        try:
            rates = [float(x) for x in _split(args.lr)]
        except ValueError:
            raise ConfigError(f"--lr: expected comma-separated numbers, got {args.lr!r}") from None
        axes = parse_axes(args.set)
        tokens = int(args.tokens) if args.tokens is not None else None
        for size in _split(args.size):
            swept = sweep(
                suite,
                size,
                rates,
                axes=axes,
                tokens=tokens,
                dry_run=args.dry_run,
                progress=not args.no_progress,
                jobs=args.jobs,
            )
            print(swept.render())
        return 0
    if args.action == "cooldown":
        try:
            at = [float(x) for x in _split(args.at)]
        except ValueError:
            raise ConfigError(f"--at: expected comma-separated fractions, got {args.at!r}") from None
        branches = cooldown_branches(
            suite, at=at or None, fraction=args.fraction, shape=args.shape, parents=_split(args.runs) or None
        )
        branch_outcomes = run_cooldown(
            suite,
            branches,
            jobs=args.jobs,
            progress=not args.no_progress,
            dry_run=args.dry_run,
            force=args.force,
        )
        print(f"suite {suite.name}: {len(branches)} cooldown branches; " + _count(branch_outcomes))
        return 1 if any(o.action in ("failed", "missing") for o in branch_outcomes) else 0
    if args.action == "convert":
        conversions = conversion_branches(suite, parents=_split(args.runs) or None)
        if not conversions:
            raise ConfigError(f"{suite.path}: no conversion branches: the suite has no conversions section")
        branch_outcomes = run_cooldown(
            suite,
            conversions,
            jobs=args.jobs,
            progress=not args.no_progress,
            dry_run=args.dry_run,
            force=args.force,
            label="convert",
        )
        print(f"suite {suite.name}: {len(conversions)} conversion branches; " + _count(branch_outcomes))
        return 1 if any(o.action in ("failed", "missing") for o in branch_outcomes) else 0
    if args.action == "status":
        branches = cooldown_branches(suite) if suite.config.cooldown.at else []
        lenders = [b.run for b in branches if not b.itself]
        statuses = add_forecasts(suite_status(suite, stale_after=args.stale_after), branches=lenders)
        conversions = conversion_branches(suite)
        if args.json:
            records = [s.to_dict() for s in statuses]
            listed = branch_records(branches + conversions)
            data = {"runs": records, "branches": listed} if listed else records
            print(json.dumps(data, indent=1))
        else:
            print(render_status(suite, statuses))
            if branches:
                print("\n" + render_branches(branches))
            if conversions:
                print("\n" + render_branches(conversions, title="conversion branches"))
        return 0

    forecast_from = FORECAST_FROM if args.forecast_from is None else args.forecast_from
    if not 0 < forecast_from < 1:
        raise ConfigError(f"--forecast-from: a share of the run in (0, 1), got {forecast_from}")
    result = analyse_suite(
        suite,
        out_dir=args.out,
        bootstrap=args.bootstrap,
        seed=args.seed,
        plots=not args.no_plots,
        x=args.x,
        forecast_from=forecast_from,
    )
    print(summary_text(result.report))
    if result.predictions is not None:
        print("", *text_lines(result.predictions), sep="\n")
    converted = analyse_conversions(suite, result.out_dir)
    if converted is not None:
        print("\n" + converted)
    if result.without_loss:
        print(f"\n{len(result.without_loss)} snapshot(s) have no recorded loss and are not in the table")
    for note in other_notes(result.report):
        print(f"note: {note}")
    print(f"\nreport: {result.summary_file} and {result.out_dir / 'report.md'}; plots in {result.out_dir}")
    return 0


def _count(outcomes) -> str:
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.action] = counts.get(o.action, 0) + 1
    return ", ".join(f"{n} {a}" for a, n in counts.items())
