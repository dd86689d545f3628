"""One call from results tables to fits, comparisons, ``fit.json``, ``report.md`` and plots.

``analyse(paths, out_dir)`` reads the tables, keeps one evaluation, and per family fits

- L(x) on the final checkpoint of every run, with x the parameter count (or non-embedding count), and the
  same law against the model size in bits;
- L(N, D) on the final checkpoints when the family has separate runs with at least 3 token budgets
  (intermediate checkpoints of one run are not separate-D runs: the LR schedule confounds D). Cooldown
  branches (rows with a ``parent``, :mod:`trilm.suite.cooldown`) are such runs: each ends cooled down at its
  own D, so L(N, D) is fitted over the branches' and the runs' final checkpoints, resampled by lineage (a
  run with its branches), while L(N) and L(bits) use the runs' own finals only;
- L(D) along each run, over its checkpoints with D > 0: training dynamics, not a scaling law in D.

Each is one :func:`trilm.scaling.fitter.fit` of a registered law (L(N) and L(bits): ``n``; L(D): ``d``;
L(N, D): ``additive``) with its bootstrap inside, and leave-one-size-out is that fit again without each size.
``form="auto"`` fits what the data support and writes a note for what it skipped and why; an explicit form
is strict and raises :class:`~trilm.scaling.errors.FitError` when a family or run cannot be fitted.
Families are then compared with a reference family (FloatLM by default) on both axes.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import numpy as np

from trilm.atomic import write_text
from trilm.scaling import report as report_md
from trilm.scaling.compare import compare_observed, compare_pair
from trilm.scaling.envelope import envelope
from trilm.scaling.errors import FitError
from trilm.scaling.fitter import Fit, fit
from trilm.scaling.identify import implausible_family
from trilm.scaling.laws import get_law
from trilm.scaling.report_types import AnalysisConfig, FamilyAnalysis, FittedPoints, Report
from trilm.scaling.table import ResultRow, family_kind, read_table

FAMILY_ORDER = {"floatlm": 0, "trilm": 1, "bilm": 2, "quantlm": 3, "other": 4}
LAW_OF_FORM = {"N": "n", "D": "d", "ND": "additive"}
"""The registered law (:data:`trilm.scaling.laws.LAWS`) each ``--form`` fits."""
MIN_LOSO_GROUPS = 4


def _family_sort_key(name: str) -> tuple[int, str]:
    return FAMILY_ORDER[family_kind(name)], name


def _choose_eval(rows: list[ResultRow], wanted: str) -> str:
    names = sorted({r.eval for r in rows})
    if wanted:
        if wanted not in names:
            raise FitError(f"no rows with eval {wanted!r}; the tables have {', '.join(names) or 'no rows'}")
        return wanted
    if "val_loss" in names:
        return "val_loss"
    if len(names) == 1:
        return names[0]
    raise FitError(f"the tables hold several evaluations ({', '.join(names)}); choose one with --eval")


def _group_runs(rows: list[ResultRow]) -> dict[str, list[ResultRow]]:
    runs: dict[str, list[ResultRow]] = defaultdict(list)
    for r in rows:
        runs[r.run].append(r)
    for run, items in runs.items():
        items.sort(key=lambda r: (r.step, r.tokens))
        for field in ("family", "size", "params"):
            values = {getattr(r, field) for r in items}
            if len(values) > 1:
                raise FitError(
                    f"run {run!r} has rows with different {field}: {sorted(map(str, values))}"
                    f" (e.g. {items[0].source} and {items[-1].source})"
                )
    return dict(runs)


@dataclasses.dataclass
class _Spec:
    """A law to fit, before fitting: its data, how to bootstrap it, and where the result goes.

    ``units`` are the bootstrap's resampling units (None: no bootstrap); specs with the same units in the
    same order and the same ``seed`` draw the same resamples, which pairs them."""

    label: str
    form: str
    inputs: dict[str, np.ndarray]
    loss: np.ndarray
    labels: list[str]
    attach: Callable[[FittedPoints], None]
    units: list[Hashable] | None = None
    seed: int = 0
    loso_groups: list[str] | None = None


def _fit_specs(specs: list[_Spec], cfg: AnalysisConfig, strict: bool, notes: list[str]) -> None:
    """Fit every spec with its bootstrap; then leave-one-size-out on the identified ones."""
    for spec in specs:
        try:
            result = fit(
                LAW_OF_FORM[spec.form],
                {**spec.inputs, "loss": spec.loss},
                bootstrap=cfg.bootstrap if spec.units is not None else 0,
                seed=spec.seed,
                level=cfg.level,
                delta=cfg.delta,
                units=spec.units,
                label=spec.label,
            )
        except FitError as exc:
            if strict:
                raise
            notes.append(f"{spec.label}: not fitted: {exc}")
            continue
        law = FittedPoints(result, spec.inputs, spec.loss, spec.labels)
        spec.attach(law)
        boot = result.bootstrap
        if spec.units is not None and cfg.bootstrap and not boot.get("n_accepted"):
            notes.append(
                f"{spec.label}: no bootstrap interval: of {boot.get('n_resamples')} resamples"
                f" {boot.get('n_degenerate')} were degenerate (too few distinct values of an input) and"
                f" {boot.get('n_not_converged')} did not converge"
            )
        if not law.identified:
            notes.append(f"{spec.label}: not identified: {law.because}")
            continue
        if not cfg.loso or spec.loso_groups is None:
            continue
        n_groups = len(set(spec.loso_groups))
        if n_groups >= MIN_LOSO_GROUPS:
            law.loso = leave_one_out(result, law.data, spec.loso_groups, delta=cfg.delta)
        else:
            notes.append(
                f"{spec.label}: leave-one-size-out skipped: it needs at least {MIN_LOSO_GROUPS} sizes,"
                f" has {n_groups}"
            )


def leave_one_out(
    full: Fit, data: dict[str, np.ndarray], groups: list[str], *, delta: float
) -> list[dict[str, Any]]:
    """Refit ``full``'s law without each group (a model size) and compare its predicted and observed losses.

    Each entry: the group, how many points it had, the mean observed and predicted loss, the relative error
    ``predicted / observed − 1`` (mean over the group's points), whether the group lay outside the range of
    the remaining sizes (a true extrapolation), or ``skipped`` with the reason the refit was impossible.
    Each refit starts from the law's coarse grid and from the full-data fit (removing one size moves the
    optimum a little)."""
    law = get_law(full.law)
    starts = np.vstack([law.coarse_grid(), full.theta])
    first = next(k for k in data if k != "loss")
    out = []
    for group in dict.fromkeys(groups):
        held = np.array([g == group for g in groups])
        entry: dict[str, Any] = {"group": group, "n_points": int(held.sum())}
        try:
            refit = fit(
                law, {k: v[~held] for k, v in data.items()}, starts=starts, delta=delta,
                label=f"{full.label} without {group}",
            )  # fmt: skip
        except FitError as exc:
            entry["skipped"] = str(exc)
            out.append(entry)
            continue
        observed = data["loss"][held]
        pred = refit.predict(**{k: v[held] for k, v in data.items() if k != "loss"}).value
        x = data[first]
        entry.update(
            observed=float(np.mean(observed)),
            predicted=float(np.mean(pred)),
            rel_error=float(np.mean(pred / observed - 1.0)),
            extrapolation=bool(np.all(x[held] > x[~held].max()) or np.all(x[held] < x[~held].min())),
        )
        out.append(entry)
    return out


def analyse(
    tables: str | Path | list[str | Path],
    out_dir: str | Path | None = None,
    config: AnalysisConfig | None = None,
    *,
    events: dict[str, list[dict[str, Any]]] | None = None,
    **overrides: Any,
) -> Report:
    """Fit, compare and (with ``out_dir``) write ``fit.json``, ``report.md`` and plots; return the Report.

    ``overrides`` are :class:`AnalysisConfig` fields, e.g. ``analyse(["results.csv"], "out", form="N",
    bootstrap=200, seed=1)``; ``events`` are the runs' schedule events for the training-curve plot.
    """
    cfg = config or AnalysisConfig()
    if overrides:
        cfg = AnalysisConfig.from_dict({**cfg.to_dict(), **overrides})
    paths = [tables] if isinstance(tables, str | Path) else list(tables)
    if not paths:
        raise FitError("no results table given")
    rows = read_table(*paths)
    if not rows:
        raise FitError(f"{', '.join(map(str, paths))}: the results table has no rows")
    eval_name = _choose_eval(rows, cfg.eval)
    rows = [r for r in rows if r.eval == eval_name]
    if cfg.families:
        unknown = sorted(set(cfg.families) - {r.family for r in rows})
        if unknown:
            raise FitError(
                f"families {unknown} are not in the table (it has {sorted({r.family for r in rows})})"
            )
        rows = [r for r in rows if r.family in cfg.families]
    runs = _group_runs(rows)
    notes: list[str] = []
    strict = cfg.form != "auto"

    by_family: dict[str, list[ResultRow]] = defaultdict(list)
    branch_finals: dict[str, list[ResultRow]] = defaultdict(list)
    for items in runs.values():
        (branch_finals if branch_parent(items[-1]) else by_family)[items[-1].family].append(items[-1])
    order = lambda r: (r.params, r.tokens)  # noqa: E731
    families = {
        f: FamilyAnalysis(
            family=f,
            finals=sorted(by_family[f], key=order),
            branch_finals=sorted(branch_finals.get(f, []), key=order),
        )
        for f in sorted(by_family, key=_family_sort_key)
    }

    # Families measured at the same set of sizes draw the same resamples (a paired bootstrap): the same seed,
    # and their points in one order of sizes, so that the sizes are the same units in the same order. A
    # family with another set of sizes gets its own seed (an independent bootstrap, also valid for a
    # difference).
    finals = [r for fa in families.values() for r in fa.finals]
    size_rank = {
        size: i
        for i, size in enumerate(
            sorted({r.size for r in finals}, key=lambda s: (min(r.params for r in finals if r.size == s), s))
        )
    }
    size_sets = sorted({tuple(sorted({r.size for r in fa.finals})) for fa in families.values()})
    seeds = {sizes: cfg.seed + 1000 * i for i, sizes in enumerate(size_sets)}
    run_fits: dict[str, FittedPoints] = {}
    specs: list[_Spec] = []
    for fa in families.values():
        if cfg.form in ("auto", "N"):
            sizes = tuple(sorted({r.size for r in fa.finals}))
            specs += _family_x_specs(fa, cfg, size_rank, seeds[sizes], strict, notes)
        if cfg.form in ("auto", "ND"):
            specs += _family_nd_specs(fa, runs, cfg, strict, notes)
    if cfg.form in ("auto", "D"):
        for run, items in runs.items():
            if not branch_parent(items[-1]):
                specs += _run_specs(run, items, run_fits, cfg, strict, notes)
    _fit_specs(specs, cfg, strict, notes)
    _check_run_fits_together(run_fits, runs, cfg, notes)

    for fa in families.values():
        if fa.branch_finals:
            fa.envelope = envelope(
                fa.family,
                [
                    {
                        "size": r.size,
                        "n": getattr(r, cfg.x),
                        "tokens": r.tokens,
                        "flops": r.flops,
                        "loss": r.loss,
                    }
                    for r in fa.cooled()
                    if r.flops > 0
                ],
                bootstrap=cfg.bootstrap,
                seed=cfg.seed,
                level=cfg.level,
            )
    reference = cfg.reference or ("floatlm" if "floatlm" in families else next(iter(families)))
    if reference not in families:
        raise FitError(f"reference family {reference!r} is not in the table (it has {sorted(families)})")
    comparisons = _compare(families, reference, cfg, notes)

    report = Report(
        config=cfg,
        tables=[str(p) for p in paths],
        eval_name=eval_name,
        n_rows=len(rows),
        families=families,
        runs=runs,
        run_fits=run_fits,
        comparisons=comparisons,
        notes=notes,
        events=dict(events or {}),
    )
    if out_dir is not None:
        write_outputs(report, Path(out_dir))
    return report


def _skip(strict: bool, notes: list[str], message: str) -> None:
    if strict:
        raise FitError(message)
    notes.append(message)


def _family_x_specs(
    fa: FamilyAnalysis,
    cfg: AnalysisConfig,
    size_rank: dict[str, int],
    seed: int,
    strict: bool,
    notes: list[str],
) -> list[_Spec]:
    finals = sorted(fa.finals, key=lambda r: (size_rank[r.size], r.params, r.tokens))
    sizes = sorted({r.size for r in finals}, key=lambda s: min(r.params for r in finals if r.size == s))
    if len(sizes) < 3:
        _skip(
            strict,
            notes,
            f"family {fa.family}: L(N) not fitted: it needs final checkpoints of at least 3"
            f" sizes to identify E + A/N^α, and has {len(sizes)} ({', '.join(sizes)})",
        )
        return []
    budgets = {r.tokens for r in finals}
    if len(budgets) > 1:
        notes.append(
            f"family {fa.family}: the final checkpoints have {len(budgets)} different token budgets;"
            " L(N) mixes them (L(N, D) separates the two)"
        )
    labels = [r.size for r in finals]
    loss = np.array([r.loss for r in finals])
    units: list[Hashable] | None = list(labels) if cfg.bootstrap else None
    x = np.array([getattr(r, cfg.x) for r in finals], dtype=float)
    bits = np.array([r.model_bits for r in finals])

    def set_x(law: FittedPoints) -> None:
        fa.law_x = law

    def set_bits(law: FittedPoints) -> None:
        fa.law_bits = law

    label = f"{fa.family} L({_axis_name(cfg.x)})"
    return [
        _Spec(label, "N", {"N": x}, loss, labels, set_x, units, seed, labels),
        _Spec(f"{fa.family} L(bits)", "N", {"N": bits}, loss, labels, set_bits, units, seed),
    ]


def _axis_name(x: str) -> str:
    return "N" if x == "params" else "N_nonemb"


def branch_parent(row: ResultRow) -> str:
    """The run a cooldown branch was started from ('' for a run of its own)."""
    return row.extra.get("parent", "") or ""


def lineage(row: ResultRow) -> str:
    """A run and its branches form one lineage: they share the training before each branch point, so a
    bootstrap resamples them together."""
    return branch_parent(row) or row.run


def _family_nd_specs(
    fa: FamilyAnalysis, runs: dict[str, list[ResultRow]], cfg: AnalysisConfig, strict: bool, notes: list[str]
) -> list[_Spec]:
    if cfg.nd_points == "final":
        points = [r for r in [*fa.finals, *fa.branch_finals] if r.tokens > 0]
    else:
        points = [r for items in runs.values() for r in items if r.family == fa.family and r.tokens > 0]
        notes.append(
            f"family {fa.family}: L(N, D) uses intermediate checkpoints (nd_points=all); the LR schedule"
            " of each run confounds D, so treat its β with care"
        )
    n_sizes = len({r.params for r in points})
    n_budgets = len({r.tokens for r in points})
    if n_sizes < 3 or n_budgets < 3 or len(points) < 5:
        _skip(
            strict,
            notes,
            f"family {fa.family}: L(N, D) not fitted: it needs runs of at least 3 sizes and 3"
            f" token budgets (5 points); the {cfg.nd_points} checkpoints give {n_sizes} sizes,"
            f" {n_budgets} budgets, {len(points)} points. Intermediate checkpoints of one run are"
            " not separate-D runs",
        )
        return []
    labels = [r.run if cfg.nd_points == "final" else f"{r.run}@{r.step}" for r in points]
    inputs = {
        "N": np.array([getattr(r, cfg.x) for r in points], dtype=float),
        "D": np.array([r.tokens for r in points]),
    }
    # resample whole runs, each with its branches
    units: list[Hashable] | None = [lineage(r) for r in points] if cfg.bootstrap else None

    def set_nd(law: FittedPoints) -> None:
        fa.law_nd = law

    loss = np.array([r.loss for r in points])
    groups = [r.size for r in points]
    return [_Spec(f"{fa.family} L(N, D)", "ND", inputs, loss, labels, set_nd, units, cfg.seed, groups)]


def _run_specs(
    run: str,
    items: list[ResultRow],
    run_fits: dict[str, FittedPoints],
    cfg: AnalysisConfig,
    strict: bool,
    notes: list[str],
) -> list[_Spec]:
    points = [r for r in items if r.tokens > 0]
    if len(points) < len(items):
        notes.append(f"run {run}: {len(items) - len(points)} checkpoint(s) at D = 0 left out of L(D)")
    if cfg.d_from > 0 and points:
        start = cfg.d_from * max(r.tokens for r in points)
        early = [r for r in points if r.tokens < start]
        points = [r for r in points if r.tokens >= start]
        if early:
            notes.append(
                f"run {run}: L(D) from D = {start:,.0f} on ({cfg.d_from:g} of the run, the end of warm-up);"
                f" {len(early)} earlier checkpoint(s) left out"
            )
    if len({r.tokens for r in points}) < 3:
        _skip(
            strict,
            notes,
            f"run {run}: L(D) not fitted: it needs at least 3 checkpoints with D > 0, has"
            f" {len({r.tokens for r in points})}",
        )
        return []

    def set_run(law: FittedPoints) -> None:
        run_fits[run] = law

    # No bootstrap: checkpoints of one run are one trajectory, not independent samples of L(D).
    inputs = {"D": np.array([r.tokens for r in points])}
    loss = np.array([r.loss for r in points])
    return [_Spec(f"{run} L(D)", "D", inputs, loss, [f"step {r.step}" for r in points], set_run)]


def _check_run_fits_together(
    run_fits: dict[str, FittedPoints], runs: dict[str, list[ResultRow]], cfg: AnalysisConfig, notes: list[str]
) -> None:
    """Per family, the identified L(D) fits must agree with each other: E may not rise with N. Each run of a
    pair where it does loses its "identified" (:func:`trilm.scaling.identify.implausible_family`)."""
    by_family: dict[str, dict[str, FittedPoints]] = defaultdict(dict)
    for run, law in run_fits.items():
        if law.identified:
            by_family[runs[run][-1].family][run] = law
    for fits in by_family.values():
        sizes = {run: float(getattr(runs[run][-1], cfg.x)) for run in fits}
        for run, why in implausible_family(fits, sizes).items():
            law = fits[run]
            law.fit.reasons = (*law.fit.reasons, why)
            notes.append(f"{law.label}: not identified: {why}")


def _compare(
    families: dict[str, FamilyAnalysis], reference: str, cfg: AnalysisConfig, notes: list[str]
) -> list[dict[str, Any]]:
    ref = families[reference]
    out = []

    def observed(fa: FamilyAnalysis) -> list[dict[str, Any]]:
        return [{"size": r.size, "params": r.params, "bits": r.model_bits, "loss": r.loss} for r in fa.finals]

    for name, fa in families.items():
        if name == reference:
            continue
        raw = compare_observed(reference, name, observed(ref), observed(fa))
        if raw["shared_sizes"]:
            out.append(raw)
        for axis, attr, value in (
            ("params", "law_x", lambda r: getattr(r, cfg.x)),
            ("bits", "law_bits", lambda r: r.model_bits),
        ):
            mine, theirs = getattr(fa, attr), getattr(ref, attr)
            if mine is None or theirs is None:
                missing = [f for f, law in ((name, mine), (reference, theirs)) if law is None]
                notes.append(
                    f"comparison of fitted curves {name} vs {reference} on {axis}: not made, no L(x) fit for"
                    f" {' and '.join(missing)} (observed losses at shared sizes are compared instead)"
                )
                continue
            laws = ((name, mine), (reference, theirs))
            unidentified = [f for f, law in laws if not law.identified]
            if unidentified:
                notes.append(
                    f"comparison of fitted curves {name} vs {reference} on {axis}: not made, the L(x) of"
                    f" {' and '.join(unidentified)} is not identified, so no size is matched by fitted loss"
                    " (observed losses at shared sizes are compared instead)"
                )
                continue
            out.append(_fitted_pair(fa, ref, attr, axis, value, cfg))
    # TriLM against BiLM as well (Spectra's second question), when both laws are identified.
    tri, bi = families.get("trilm"), families.get("bilm")
    if (
        tri is not None
        and bi is not None
        and tri.law_x is not None
        and bi.law_x is not None
        and reference not in ("trilm", "bilm")
        and tri.law_x.identified
        and bi.law_x.identified
    ):
        out.append(_fitted_pair(tri, bi, "law_x", "params", lambda r: getattr(r, cfg.x), cfg))
    return out


def _fitted_pair(
    fa: FamilyAnalysis,
    ref: FamilyAnalysis,
    attr: str,
    axis: str,
    value: Callable[[ResultRow], float],
    cfg: AnalysisConfig,
) -> dict[str, Any]:
    mine, theirs = getattr(fa, attr), getattr(ref, attr)
    points = [{"size": r.size, "x": float(value(r)), "loss": r.loss} for r in fa.finals]
    x_ref = np.array([value(r) for r in ref.finals], dtype=float)
    return compare_pair(
        ref.family,
        fa.family,
        theirs.fit,
        mine.fit,
        points,
        x_ref,
        axis=axis,
        level=cfg.level,
    )


def write_outputs(report: Report, out_dir: Path) -> None:
    """Write ``fit.json``, ``report.md`` and (unless disabled) the PNG and SVG plots into ``out_dir``."""
    # deferred for start-up time: loads matplotlib only when called
    from trilm.scaling import plots

    out_dir.mkdir(parents=True, exist_ok=True)
    if report.config.plots:
        report.files.update(plots.write_all(report, out_dir))
    report.files["json"] = str(out_dir / "fit.json")
    report.files["markdown"] = str(out_dir / "report.md")
    write_text(out_dir / "fit.json", json.dumps(report.to_dict(), indent=1) + "\n")
    write_text(out_dir / "report.md", report_md.render(report, out_dir))
