"""``trilm suite sweep``: tune the peak learning rate per family at one size before training the suite.

A family comparison is only fair when each family trains at a learning rate that suits it (Spectra grid
searched its hyperparameters per family). The sweep trains the suite's ``<family>-<size>`` run once per
learning rate — everything else exactly as in the suite — under ``<root>/sweep/``, and prints the final
validation loss of each. The best rate of each family then goes into the suite file as the family's
``overrides: {optim: {lr: …}}``. Finished sweep runs are skipped on a rerun, like any suite run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from trilm.config import ConfigError
from trilm.suite.config import Suite, SuiteRun
from trilm.suite.launch import launch_local
from trilm.suite.status import run_status
from trilm.suite.text import table


@dataclasses.dataclass
class SweepResult:
    size: str
    rates: list[float]
    losses: dict[str, dict[float, float | None]]
    """family → learning rate → final validation loss (None when the run did not finish)."""

    def best(self, family: str) -> float | None:
        done = {lr: loss for lr, loss in self.losses[family].items() if loss is not None}
        return min(done, key=done.get) if done else None

    def render(self, markdown: bool = False) -> str:
        headers = ["family", *[f"lr {lr:g}" for lr in self.rates], "best"]
        rows = []
        for family, losses in self.losses.items():
            best = self.best(family)
            cells = [f"{losses[lr]:.4f}" if losses[lr] is not None else "–" for lr in self.rates]
            rows.append([family, *cells, "–" if best is None else f"{best:g}"])
        return table(headers, rows, markdown=markdown)


def sweep_runs(suite: Suite, size: str, rates: list[float]) -> list[tuple[SuiteRun, float]]:
    """The suite's ``<family>-<size>`` runs (first token budget) at each learning rate."""
    base = [r for r in suite.runs if r.size == size]
    if not base:
        sizes = sorted({r.size for r in suite.runs})
        raise ConfigError(f"suite {suite.name}: no size {size!r} (sizes: {', '.join(sizes)})")
    first_budget = base[0].tokens
    runs = []
    for run in (r for r in base if r.tokens == first_budget):
        for lr in rates:
            name = f"{run.name}-lr{lr:g}"
            cfg = run.cfg.with_overrides([f"optim.lr={lr!r}", f"run_dir={Path(suite.root) / 'sweep' / name}"])
            runs.append((dataclasses.replace(run, name=name, cfg=cfg), lr))
    return runs


def _final_loss(run: SuiteRun) -> float | None:
    status = run_status(run)
    return status.val_loss if status.state == "finished" else None


def sweep(
    suite: Suite,
    size: str,
    rates: list[float],
    *,
    dry_run: bool = False,
    progress: bool = True,
    echo: Callable[[str], None] = print,
) -> SweepResult:
    if not rates or any(lr <= 0 for lr in rates):
        raise ConfigError(f"--lr: learning rates must be > 0, got {rates}")
    pairs = sweep_runs(suite, size, rates)
    runs = [run for run, _ in pairs]
    launch_local(suite, runs, dry_run=dry_run, progress=progress, echo=echo)
    losses: dict[str, dict[float, float | None]] = {}
    for run, lr in pairs:
        losses.setdefault(run.family, {})[lr] = _final_loss(run)
    result = SweepResult(size, list(rates), losses)
    if not dry_run:
        out = Path(suite.root) / "sweep" / f"lr-{size}.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        budget = runs[0].cfg.steps * runs[0].cfg.batch_tokens
        out.write_text(
            f"# Learning-rate sweep of suite {suite.name} at size {size}\n\n"
            f"Final validation loss (nats/token) after {runs[0].cfg.steps} steps ({budget:,} tokens);"
            " everything else as in the suite.\n\n" + result.render(markdown=True) + "\n"
        )
        echo(f"wrote {out}")
    return result
