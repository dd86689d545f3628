"""``trilm scaling fit --law NAME`` and ``trilm scaling predict``: any law of the registry on the user's data.

``fit --law`` fits one law and writes ``fit.json`` (:meth:`trilm.scaling.fitter.Fit.save`) into ``--out``:

- a curve law (``tissue``, ``tissue_lambda``, ``multipower``) on loss-curve tables (CSV or JSONL with
  ``step``, ``lr``, ``loss``; a trilm run's ``logs/metrics.jsonl`` is one). All tables are runs of one model
  and share its parameters;
- a size law on results tables: the last checkpoint of every run, one fit per family (``fit-FAMILY.json``
  when there are several; ``fit.json`` for one), except ``precision``, which is one law across families.

``predict FIT`` evaluates a saved fit along a schedule table or at sizes and budgets, prints a table and
writes the predictions (``--out``, JSON) and a plot beside them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from trilm.scaling import points
from trilm.scaling.curves import read_curves, read_schedule
from trilm.scaling.errors import FitError
from trilm.scaling.fitter import Fit, fit
from trilm.scaling.laws import get_law
from trilm.scaling.predict import along_schedule, at_sizes, plot_predictions, write_predictions
from trilm.scaling.table import read_table


def _describe(result: Fit) -> str:
    params = ", ".join(f"{k} = {v:.4g}" for k, v in result.params.items())
    verdict = "identified" if result.identified else "not identified: " + "; ".join(result.reasons)
    return f"{result.label}: {result.formula}; {params} ({result.n_points} points; {verdict})"


def fit_law_command(args: argparse.Namespace) -> int:
    law = get_law(args.law)
    out = args.out or args.tables[0].parent / "scaling"
    common = {"bootstrap": args.bootstrap, "seed": args.seed, "level": args.level, "delta": args.delta}
    written: list[Path] = []
    if law.kind == "curve":
        curves = read_curves(args.tables, loss_column=args.loss)
        result = fit(law, curves, label=f"{law.name} on {len(curves)} curve(s)", **common)
        written.append(result.save(Path(out) / "fit.json"))
        print(_describe(result))
    else:
        rows = read_table(*args.tables)
        eval_name = points.choose_eval(rows, args.eval)
        finals = points.final_rows(rows, eval_name)
        if args.families:
            finals = [r for r in finals if r.family in args.families]
        if not finals:
            raise FitError(f"no runs to fit in {', '.join(map(str, args.tables))} (eval {eval_name!r})")
        groups = {"all": finals} if law.name == "precision" else points.by_family(finals)
        for name, group in groups.items():
            data = points.size_data(group, args.x)
            result = fit(law, data, units=data["unit"], label=f"{law.name} ({name})", **common)
            path = Path(out) / ("fit.json" if len(groups) == 1 else f"fit-{name}.json")
            written.append(result.save(path))
            print(_describe(result))
    for path in written:
        print(f"wrote {path}")
    return 0


def predict_command(args: argparse.Namespace) -> int:
    result = Fit.load(args.fit)
    if args.schedule is not None:
        if args.params or args.tokens or args.bits:
            raise FitError("give either --schedule or --params/--tokens, not both")
        target, measured = read_schedule(args.schedule)
        rows = along_schedule(result, target, measured)
        shown = [rows[-1]] if len(rows) > 12 else rows
        head = "step"
    else:
        rows = at_sizes(result, args.params or [], args.tokens or [], args.bits or [])
        shown, head = rows, "params, tokens"
    pct, refits = round(result.level * 100), result.bootstrap.get("n_accepted", 0)
    print(f"{result.law}: {result.formula}  ({pct} % interval of {refits} refits)")
    for r in shown:
        where = (
            f"step {r['step']}"
            if "step" in r
            else ", ".join(f"{k} {r[k]:.4g}" for k in ("params", "tokens", "bits") if k in r)
        )
        band = "" if r["low"] is None else f" [{r['low']:.4f}, {r['high']:.4f}]"
        print(
            f"  {where}: {r['loss']:.4f}{band}"
            + (f"  measured {r['measured']:.4f}" if "measured" in r else "")
        )
    if len(shown) < len(rows):
        print(f"  ({len(rows)} {head}s in all: --out writes every one)")
    out = args.out or Path(args.fit).with_name("predictions.json")
    print(f"wrote {write_predictions(out, result, rows)}")
    if not args.no_plot:
        print(f"wrote {plot_predictions(Path(out).with_suffix('.png'), result, rows)}")
    return 0


__all__ = ["fit_law_command", "predict_command"]
