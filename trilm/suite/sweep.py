"""``trilm suite sweep``: tune the peak learning rate (and any other run key) per family and size.

A family comparison is only fair when each family trains at a learning rate that suits it (Spectra grid
searched its hyperparameters per family), and a size ladder only resolves size when each size does: the
best rate falls as models widen. The sweep trains the suite's ``<family>-<size>`` run once per learning
rate — everything else exactly as in the suite — under ``<root>/sweep/``, and prints the final validation
loss of each. Extra grid axes (``--set batch_tokens=1024,4096``, ``--set schedule.warmup=0.01,0.1``) and a
shorter budget (``--tokens``) make it the tool for the pilots that choose batch size and warm-up too. The
best rate of each family then goes into the suite file as the family's (or size's) ``overrides``.
Finished sweep runs are skipped on a rerun, like any suite run.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from trilm.atomic import write_text
from trilm.config import ConfigError
from trilm.suite.config import Suite, SuiteRun, budget_label
from trilm.suite.launch import launch_local
from trilm.suite.status import run_status
from trilm.suite.text import duration, table


@dataclasses.dataclass
class SweepResult:
    size: str
    rates: list[float]
    losses: dict[str, dict[float, float | None]]
    """row → learning rate → final validation loss (None when the run did not finish). A row is the family,
    followed by the values of the extra axes when there are any (``floatlm batch_tokens=2048``)."""
    tokens: int = 0
    """Training tokens of every run of the sweep."""
    wall_s: dict[str, dict[float, float | None]] = dataclasses.field(default_factory=dict)
    """row → learning rate → wall seconds of the run (as ``trilm suite status`` measures it)."""

    def best(self, row: str) -> float | None:
        done = {lr: loss for lr, loss in self.losses[row].items() if loss is not None}
        return min(done, key=done.__getitem__) if done else None

    def render(self, markdown: bool = False) -> str:
        headers = ["run", *[f"lr {lr:g}" for lr in self.rates], "best", "wall"]
        rows = []
        for row, losses in self.losses.items():
            best = self.best(row)
            cells = [f"{losses[lr]:.4f}" if losses[lr] is not None else "–" for lr in self.rates]
            walls = [w for w in self.wall_s.get(row, {}).values() if w is not None]
            rows.append([row, *cells, "–" if best is None else f"{best:g}", duration(sum(walls) or None)])
        return table(headers, rows, markdown=markdown)


def parse_axes(items: list[str]) -> dict[str, list[Any]]:
    """``["batch_tokens=1024,4096", "schedule.warmup=0.01,0.1"]`` → ``{key: [values…]}`` (YAML scalars)."""
    axes: dict[str, list[Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or not raw.strip():
            raise ConfigError(f"--set: expected KEY=V1,V2,…, got {item!r}")
        if key in axes or key == "optim.lr":
            raise ConfigError(f"--set: {key} is given twice (the learning rates come from --lr)")
        values = [yaml.safe_load(v) for v in raw.split(",") if v.strip()]
        if len(set(map(str, values))) != len(values):
            raise ConfigError(f"--set {key}: repeated value in {raw!r}")
        axes[key] = values
    return axes


def _label(key: str, value: Any, keys: list[str]) -> str:
    """``batch_tokens1024``; a key whose last part another axis shares keeps its path (``data_seed7``)."""
    leaf = key.rsplit(".", 1)[-1]
    if sum(k.rsplit(".", 1)[-1] == leaf for k in keys) > 1:
        leaf = key.replace(".", "_")
    return f"{leaf}{value:g}" if isinstance(value, float) else f"{leaf}{value}"


def _overrides(run: SuiteRun, setting: dict[str, Any]) -> list[str]:
    """``key=value`` overrides for one grid point; a new global batch brings a micro-batch that divides it."""
    out = [f"{k}={v!r}" if isinstance(v, float) else f"{k}={v}" for k, v in setting.items()]
    if "batch_tokens" in setting and "micro_batch" not in setting:
        sequences = int(setting["batch_tokens"]) // run.cfg.sequence_length
        out.append(f"micro_batch={math.gcd(run.cfg.micro_batch, max(sequences, 1))}")
    return out


@dataclasses.dataclass
class SweepPoint:
    run: SuiteRun
    row: str
    lr: float


def sweep_runs(
    suite: Suite,
    size: str,
    rates: list[float],
    *,
    axes: dict[str, list[Any]] | None = None,
    tokens: int | None = None,
) -> list[SweepPoint]:
    """The suite's ``<family>-<size>`` runs (first token budget, or ``tokens``) at each grid point."""
    base = [r for r in suite.runs if r.size == size]
    if not base:
        sizes = sorted({r.size for r in suite.runs})
        raise ConfigError(f"suite {suite.name}: no size {size!r} (sizes: {', '.join(sizes)})")
    axes = axes or {}
    first_budget = base[0].tokens
    points = []
    for run in (r for r in base if r.tokens == first_budget):
        for values in itertools.product(*axes.values()):
            setting = dict(zip(axes, values))
            labels = [_label(k, v, list(axes)) for k, v in setting.items()]
            row = " ".join([run.family, *(f"{k}={v}" for k, v in setting.items())])
            for lr in rates:
                name = "-".join([run.name, *([budget_label(tokens)] if tokens else []), *labels, f"lr{lr:g}"])
                extra = [*_overrides(run, setting), *([f"tokens={tokens}"] if tokens else [])]
                try:
                    cfg = run.cfg.with_overrides(
                        [*extra, f"optim.lr={lr!r}", f"run_dir={Path(suite.root) / 'sweep' / name}"]
                    )
                except ConfigError as exc:
                    raise ConfigError(f"sweep run {name}: {exc}") from None
                points.append(SweepPoint(dataclasses.replace(run, name=name, cfg=cfg), row, lr))
    return points


def sweep(
    suite: Suite,
    size: str,
    rates: list[float],
    *,
    axes: dict[str, list[Any]] | None = None,
    tokens: int | None = None,
    dry_run: bool = False,
    progress: bool = True,
    jobs: int = 1,
    echo: Callable[[str], None] = print,
) -> SweepResult:
    if not rates or any(lr <= 0 for lr in rates):
        raise ConfigError(f"--lr: learning rates must be > 0, got {rates}")
    if tokens is not None and tokens <= 0:
        raise ConfigError(f"--tokens: must be > 0, got {tokens}")
    points = sweep_runs(suite, size, rates, axes=axes, tokens=tokens)
    runs = [p.run for p in points]
    launch_local(suite, runs, dry_run=dry_run, progress=progress, jobs=jobs, echo=echo)
    losses: dict[str, dict[float, float | None]] = {}
    walls: dict[str, dict[float, float | None]] = {}
    for p in points:
        status = run_status(p.run)
        finished = status.state == "finished"
        losses.setdefault(p.row, {})[p.lr] = status.val_loss if finished else None
        walls.setdefault(p.row, {})[p.lr] = status.wall_s if finished else None
    budget = runs[0].cfg.steps * runs[0].cfg.batch_tokens
    result = SweepResult(size, list(rates), losses, budget, walls)
    if not dry_run:
        out = Path(suite.root) / "sweep" / f"lr-{size}{'-' + budget_label(tokens) if tokens else ''}.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        steps = sorted({r.cfg.steps for r in runs})
        write_text(
            out,
            f"# Learning-rate sweep of suite {suite.name} at size {size}\n\n"
            f"Final validation loss (nats/token) after {budget:,} tokens"
            f" ({', '.join(f'{s:,}' for s in steps)} steps); everything else as in the suite. Wall time is"
            " per row, all rates together.\n\n" + result.render(markdown=True) + "\n",
        )
        echo(f"wrote {out}")
    return result
