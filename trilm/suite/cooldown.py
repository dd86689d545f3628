"""``trilm suite cooldown``: cooldown branches of a suite's WSD runs, one point of L(N, D) per branch.

A WSD run (``schedule.kind: wsd``) holds its peak rate until its cooldown, so its state at step s is the
state of every shorter WSD run at step s. A *branch* that ends at a fraction ``at`` of its parent's budget
with a cooldown over its last ``fraction`` therefore starts from the parent's state where that cooldown
begins and trains only the cooldown; it ends with the weights a fresh run of that length would have
(``tests/train/test_branch.py`` checks it bitwise). One run per size then gives a loss at every budget in
``at`` — what Hägele et al. (2024) use to make a whole L(N, D) grid cost about one run per size.

Branches live in ``<root>/branches/<parent>-cd<D>`` as ordinary run directories (resumable; rerunning skips
finished ones) whose config names the parent state in ``branch_from``; the parent's directory is only read.
Their snapshots record ``extra.branch = {parent, step}``, so the results table and ``trilm suite analyse``
tell branches from their parents. The parents keep the states the branches need because the suite's
``cooldown`` section puts those steps into their ``checkpoint.keep_states_at``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from trilm.config import ConfigError
from trilm.schedule import CooldownBranch, Schedule, cooldown_branch
from trilm.store.integrity import is_complete
from trilm.suite.config import Suite, SuiteRun, budget_label, is_parent_itself
from trilm.suite.forecast import run_forecast
from trilm.suite.launch import launch_local
from trilm.suite.status import run_status
from trilm.suite.text import si, table

BRANCHES_DIR = "branches"


@dataclasses.dataclass
class Branch:
    """One cooldown branch: the run that trains it, its parent, and where it sits in the parent."""

    run: SuiteRun
    parent: SuiteRun
    spec: CooldownBranch
    itself: bool
    """The branch is its parent: as long, cooled down the same way (its final checkpoint is the point)."""
    conversion: str = ""
    """A conversion branch's family (:mod:`trilm.suite.convert`): its ``cooldown_steps`` are the steps
    it trains as that family."""

    @property
    def start_state(self):
        return self.parent.run_dir / "state" / f"step-{self.spec.start}"

    @property
    def tokens(self) -> int:
        return self.spec.steps * self.parent.cfg.batch_tokens


def branch_name(parent: SuiteRun, tokens: int) -> str:
    return f"{parent.name}-cd{budget_label(tokens)}"


def cooldown_branches(
    suite: Suite,
    *,
    at: list[float] | None = None,
    fraction: float | None = None,
    shape: str | None = None,
    parents: list[str] | None = None,
) -> list[Branch]:
    """The branches of the suite's runs (``parents`` by name; default all) at ``at`` (default: the suite's
    ``cooldown`` section), each cooling down over ``fraction`` of its length in ``shape``."""
    cd = suite.config.cooldown
    at = list(at or cd.at)
    fraction = cd.fraction if fraction is None else fraction
    shape = shape or cd.shape
    if not at:
        raise ConfigError(
            f"{suite.path}: no cooldown branches asked for: give --at, or a cooldown section with at: […]"
        )
    if shape not in ("1-sqrt", "linear"):
        raise ConfigError(f"--shape: {shape!r} is not 1-sqrt or linear")
    chosen = [suite.run(name) for name in parents] if parents else list(suite.runs)
    out = []
    for parent in chosen:
        cfg = parent.cfg
        if cfg.schedule.kind != "wsd":
            raise ConfigError(
                f"run {parent.name}: schedule kind {cfg.schedule.kind!r}; cooldown branches need a WSD parent"
                " (schedule.kind: wsd)"
            )
        sched = Schedule.for_optimizer(cfg.optim, cfg.schedule, cfg.steps)
        for a in at:
            try:
                spec = cooldown_branch(cfg.steps, a, fraction)
            except ConfigError as exc:
                raise ConfigError(f"run {parent.name}: {exc}") from None
            assert sched.cooldown_start is not None  # a WSD schedule has a cooldown
            if spec.start < max(sched.warmup_steps, 1) or spec.start > sched.cooldown_start:
                raise ConfigError(
                    f"run {parent.name}: the branch at {a:g} would start at step {spec.start}, outside the"
                    f" parent's stable phase (steps {sched.warmup_steps}–{sched.cooldown_start})"
                )
            tokens = spec.steps * cfg.batch_tokens
            name = branch_name(parent, tokens)
            itself = is_parent_itself(cfg, spec, shape)
            branch_cfg = cfg.with_overrides(
                [
                    f"tokens={tokens}",
                    f"schedule.warmup={sched.warmup_steps}",
                    f"schedule.cooldown={spec.cooldown_steps}",
                    f"schedule.cooldown_shape={shape}",
                    f"run_dir={suite.root / BRANCHES_DIR / name}",
                    f"branch_from={parent.run_dir / 'state' / f'step-{spec.start}'}",
                    "checkpoint.keep_states_at=[]",
                ]
            )
            run = dataclasses.replace(
                parent, name=name, tokens=tokens, cfg=branch_cfg, parent=parent.name, branch_step=spec.start
            )
            out.append(Branch(run, parent, spec, itself))
    return out


def branch_state(branch: Branch) -> tuple[str, str]:
    """``(state, detail)``: the branch's run state; for one not started, whether its parent state is there."""
    if branch.itself:
        return "parent", "the parent's own cooldown (its final checkpoint is this point)"
    status = run_status(branch.run)
    if status.state != "pending":
        return status.state, ""
    if is_complete(branch.start_state):
        return "ready", f"from {branch.start_state}"
    parent = run_status(branch.parent)
    if parent.step < branch.spec.start and parent.state != "finished":
        return "waiting", f"for its parent ({parent.step:,} of {branch.spec.start:,} steps)"
    where = "conversions" if branch.conversion else f"cooldown.at (add {branch.spec.at:g})"
    return "missing", (
        f"its parent passed step {branch.spec.start:,} without keeping that state (list the branch in the"
        f" suite's {where} before the parent trains, so checkpoint.keep_states_at holds it)"
    )


@dataclasses.dataclass
class CooldownOutcome:
    branch: str
    action: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.branch:<24} {self.action}{': ' + self.detail if self.detail else ''}"


def run_cooldown(
    suite: Suite,
    branches: list[Branch],
    *,
    jobs: int = 1,
    progress: bool = True,
    dry_run: bool = False,
    force: bool = False,
    echo: Callable[[str], None] = print,
    label: str = "cooldown",
) -> list[CooldownOutcome]:
    """Train every branch whose parent state is there (finished ones are skipped, stopped ones resume);
    say for the others why not (the parent has not got there yet, or did not keep the state)."""

    outcomes, ready = [], []
    for b in branches:
        state, detail = branch_state(b)
        if state in ("ready", "stopped", "failed", "running"):
            ready.append(b)
        else:
            action = {"parent": "is its parent", "finished": "skipped"}.get(state, state)
            detail = detail or f"finished ({b.spec.steps:,} steps)"
            outcomes.append(CooldownOutcome(b.run.name, action, detail))
            echo(str(outcomes[-1]))
    if ready:
        what = "its conversion" if label == "convert" else "its cooldown"
        echo(
            f"{label}: {len(ready)} branch(es) to train, each only {what}"
            f" ({sum(b.spec.cooldown_steps for b in ready):,} steps in all) → {suite.root / BRANCHES_DIR}"
        )
        done = launch_local(
            suite,
            [b.run for b in ready],
            dry_run=dry_run,
            progress=progress,
            force=force,
            jobs=jobs,
            echo=echo,
        )
        outcomes += [CooldownOutcome(o.run, o.action, o.detail) for o in done]
    return outcomes


def render_branches(branches: list[Branch], title: str = "cooldown branches") -> str:
    """The branch table of ``trilm suite status``: parent, start, length, state and loss of every branch;
    a table of conversion branches also gives each one's final-loss forecast (:mod:`trilm.suite.forecast`,
    fitted on the conversion's own checkpoints)."""
    converted = any(b.conversion for b in branches)
    phase = "converted" if converted else "cooldown"
    headers = ["branch", "parent", "from step", "steps", "tokens", phase, "state", "val loss", "note"]
    if converted:
        headers.insert(-1, "final loss [interval]")
    rows = []
    for b in branches:
        state, detail = branch_state(b)
        status = run_status(b.parent if b.itself else b.run)
        loss = status.val_loss if status.state == "finished" else None
        row = [
            b.run.name,
            b.parent.name,
            f"{b.spec.start:,}",
            f"{b.spec.steps:,}",
            si(b.tokens),
            f"{b.spec.cooldown_steps:,}",
            state,
            "–" if loss is None else f"{loss:.4f}",
            detail if state in ("waiting", "missing") else "",
        ]
        if converted:
            forecast = run_forecast(b.run, status.state)
            row.insert(-1, "–" if forecast is None else forecast.text())
        rows.append(row)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row[6]] = counts.get(row[6], 0) + 1
    head = f"{title}: {len(branches)} (" + ", ".join(f"{n} {s}" for s, n in counts.items()) + ")"
    return "\n".join([head, "", table(headers, rows, left=2)])


def branch_records(branches: list[Branch]) -> list[dict[str, Any]]:
    """``trilm suite status --json``'s branch entries."""
    out = []
    for b in branches:
        state, detail = branch_state(b)
        out.append(
            {
                "branch": b.run.name,
                "parent": b.parent.name,
                "at": b.spec.at,
                "start_step": b.spec.start,
                "steps": b.spec.steps,
                "cooldown_steps": b.spec.cooldown_steps,
                "tokens": b.tokens,
                "state": state,
                "detail": detail,
                **({"conversion": b.conversion} if b.conversion else {}),
            }
        )
    return out
