"""``trilm suite convert``: conversion branches — a suite's float runs continued as TriLMs (or BiLMs).

Each entry of the suite's ``conversions`` section turns every run of its ``parents`` family into a branch
that starts from the parent's resumable state at ``start`` (by default where its WSD cooldown starts) and
trains the rest of the parent's budget as a ``family`` model by the crossover recipe (its overrides may
change any part), keeping the parent's AdamW moments unless they reset them (:mod:`trilm.train.convert`).
So at equal total tokens it sits beside two runs the suite already has: the float run's own cooldown (its
parent's final checkpoint) and the run of ``family`` trained from scratch.

Branches live in ``<root>/branches/<parent>-<name>`` as ordinary run directories, as cooldown branches
do (:mod:`trilm.suite.cooldown`, whose table, states and launcher they share); their snapshots record
``extra.branch = {parent, step}`` and ``extra.conversion``, so the results table and ``trilm suite
analyse`` tell them apart. Parents keep the states their branches need because expanding the suite puts
those steps into their ``checkpoint.keep_states_at``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from trilm.atomic import write_text
from trilm.config import ConfigError
from trilm.eval.suite import write_suite_table
from trilm.schedule import CooldownBranch
from trilm.store.integrity import complete_steps
from trilm.suite.config import Suite, SuiteConversionConfig, SuiteRun, deep_merge
from trilm.suite.cooldown import BRANCHES_DIR, Branch
from trilm.suite.status import run_status
from trilm.suite.text import si, table
from trilm.train.config import TrainConfig
from trilm.train.convert import CROSSOVER_OPTIM, apply_recipe, branch_teacher


def _branch_config(
    suite: Suite, parent: SuiteRun, conv: SuiteConversionConfig, start: int, end: int, name: str
) -> TrainConfig:
    """The parent's config as a ``conv.family`` model (same tensors; the family's quantizer defaults),
    started from the parent's state at ``start`` and trained to step ``end``, with the conversion's
    overrides on top. Under ``convert.recipe: crossover`` (the default) the conversion's phase is its own,
    not the float run's: the parent's ``schedule``, ``distill``, ``optim.weight_decay`` and
    ``optim.min_lr_ratio`` give way to the crossover's values wherever the overrides leave them
    (:func:`~trilm.train.convert.apply_recipe`), with the parent's snapshot at ``start`` as the teacher
    (written with the state the branch starts from: the step is one of the parent's ``keep_states_at``, or
    its last). Filled in here, so the suite's config of a branch is the one the trainer resolves."""
    data = parent.cfg.to_dict()
    data["tokens"] = end * parent.cfg.batch_tokens
    model = dict(data["model"])
    model.pop("quant", None)  # the new family's quantizer unless the overrides set one
    model["family"] = conv.family
    model["name"] = f"{conv.family}-{parent.size}"
    data["model"] = model
    data["run_dir"] = str(suite.root / BRANCHES_DIR / name)
    data["branch_from"] = str(parent.run_dir / "state" / f"step-{start}")
    data["checkpoint"] = {**data["checkpoint"], "keep_states_at": []}
    merged = deep_merge(data, conv.overrides)
    convert = merged.get("convert")
    if not (isinstance(convert, dict) and convert.get("recipe") == "crossover"):
        return _built(merged, name)
    for key in ("schedule", "distill"):
        data.pop(key, None)
    data["optim"] = {k: v for k, v in data["optim"].items() if k not in CROSSOVER_OPTIM}
    cfg = _built(deep_merge(data, conv.overrides), name)
    return apply_recipe(cfg, teacher=str(branch_teacher(cfg.branch_from)))


def _built(data: dict[str, Any], name: str) -> TrainConfig:
    try:
        return TrainConfig.from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"conversion {name}: {exc}") from None


def conversion_branches(suite: Suite, parents: list[str] | None = None) -> list[Branch]:
    """The conversion branches of the suite's ``conversions`` section (of ``parents`` by run name;
    default all), in section order, then run order."""
    chosen = {name: suite.run(name) for name in parents} if parents else None
    out = []
    for conv in suite.config.conversions:
        for parent in suite.runs:
            if parent.family != conv.parents or (chosen is not None and parent.name not in chosen):
                continue
            start, end = conv.start_step(parent.cfg), conv.end_step(parent.cfg)
            name = f"{parent.name}-{conv.suffix}"
            cfg = _branch_config(suite, parent, conv, start, end, name)
            run = dataclasses.replace(
                parent,
                name=name,
                family=conv.family,
                tokens=cfg.tokens,
                cfg=cfg,
                parent=parent.name,
                branch_step=start,
                converts_from=parent.family,
            )
            spec = CooldownBranch(
                at=start / parent.cfg.steps, steps=cfg.steps, cooldown_steps=cfg.steps - start
            )
            out.append(Branch(run, parent, spec, itself=False, conversion=conv.family))
    return out


def _final_loss(run: SuiteRun) -> float | None:
    status = run_status(run)
    return status.val_loss if status.state == "finished" else None


def conversion_comparison(suite: Suite, branches: list[Branch]) -> list[dict[str, Any]]:
    """Per conversion branch, its final validation loss beside the two runs it competes with: its parent's
    own end (the float run's cooldown; at equal tokens unless the branch starts there) and the run of its
    family trained from scratch at the parent's size and the branch's total tokens (None where a run is not
    finished or not in the suite)."""
    out = []
    for b in branches:
        scratch = [
            r
            for r in suite.runs
            if r.family == b.conversion
            and r.size == b.parent.size
            and r.cfg.steps * r.cfg.batch_tokens == b.run.cfg.steps * b.run.cfg.batch_tokens
        ]
        final = _final_loss(b.run)
        scratch_loss = _final_loss(scratch[0]) if scratch else None
        out.append(
            {
                "branch": b.run.name,
                "parent": b.parent.name,
                "start_step": b.spec.start,
                "share": b.spec.cooldown_steps / b.spec.steps,
                "tokens": b.tokens,
                "val_loss": final,
                "parent_val_loss": _final_loss(b.parent),
                "scratch_run": scratch[0].name if scratch else None,
                "scratch_val_loss": scratch_loss,
                "gap": None if final is None or scratch_loss is None else final - scratch_loss,
            }
        )
    return out


def render_comparison(rows: list[dict[str, Any]]) -> str:
    """The table ``trilm suite analyse`` prints and writes to ``conversions.md``."""

    def loss(value: float | None) -> str:
        return "–" if value is None else f"{value:.4f}"

    headers = ["branch", "from step", "converted", "tokens", "val loss", "parent's end", "scratch run"]
    headers += ["scratch val loss", "gap to scratch"]
    body = [
        [
            r["branch"],
            f"{r['start_step']:,}",
            f"{100 * r['share']:.0f}%",
            si(r["tokens"]),
            loss(r["val_loss"]),
            loss(r["parent_val_loss"]),
            r["scratch_run"] or "–",
            loss(r["scratch_val_loss"]),
            "–" if r["gap"] is None else f"{r['gap']:+.4f}",
        ]
        for r in rows
    ]
    head = (
        "conversion branches at equal total tokens (gap = branch − the family trained from scratch;"
        " < 0: converting paid)"
    )
    return "\n".join([head, "", table(headers, body, left=2)])


def analyse_conversions(suite: Suite, out_dir: Path) -> str | None:
    """``trilm suite analyse``'s part for conversion branches: their checkpoints go to
    ``<root>/conversions.csv`` (kept out of ``results.csv``, whose per-family laws are fitted on runs
    trained as one family from their first step) and the comparison to ``out_dir/conversions.md``;
    returns its text (None: the suite has no conversions)."""
    branches = conversion_branches(suite)
    if not branches:
        return None
    dirs = [b.run.run_dir for b in branches if complete_steps(b.run.run_dir / "snapshots")]
    if dirs:
        write_suite_table(dirs, suite.root / "conversions.csv")
    text = render_comparison(conversion_comparison(suite, branches))
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text(out_dir / "conversions.md", text + "\n")
    return text
