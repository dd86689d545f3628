"""``trilm suite plan``: what a suite costs before anything runs.

Per run: parameters, training FLOPs (the one FLOPs function, :func:`trilm.model.flops.flops_per_token`, times
the tokens the run actually trains: ``steps · batch_tokens``), steps, devices, device-hours at the suite's
stated MFU, and its checkpoints — how many model snapshots the schedule writes and the disk they take with the
resumable states kept alongside. Disk is an estimate from bytes per parameter:

- a snapshot holds the model's weights in the training dtype (bf16 on GPU: 2 bytes, fp32: 4 bytes);
- a resumable state holds those weights plus Adam's fp32 master copy and two moments (bf16: 2 + 12 bytes,
  fp32: 4 + 8 bytes), and ``checkpoint.keep_last`` of them are kept.
"""

from __future__ import annotations

import dataclasses

from trilm.model.flops import flops_per_token, parameter_counts
from trilm.suite.config import HardwareConfig, Suite, SuiteRun, shown_path
from trilm.suite.text import hours, nbytes, si, table
from trilm.train.save_steps import snapshot_steps, state_steps


def uses_bf16(run: SuiteRun, hardware: HardwareConfig) -> bool:
    """The dtype the run will train in on the suite's hardware (``precision: auto`` = bf16 on a GPU)."""
    precision = run.cfg.precision
    return precision == "bf16" or (precision == "auto" and hardware.is_gpu)


@dataclasses.dataclass
class RunCost:
    run: SuiteRun
    params: int
    nonembedding_params: int
    flops_per_token: float
    tokens: int
    """Tokens actually trained: steps × batch_tokens (at most the budget)."""
    steps: int
    snapshots: int
    snapshot_bytes: float
    state_bytes: float
    states_kept: int
    device_hours: float | None

    @property
    def flops(self) -> float:
        return self.flops_per_token * self.tokens

    @property
    def disk_bytes(self) -> float:
        return self.snapshots * self.snapshot_bytes + self.states_kept * self.state_bytes

    @property
    def wall_hours(self) -> float | None:
        return None if self.device_hours is None else self.device_hours / self.run.devices


def run_cost(run: SuiteRun, hardware: HardwareConfig) -> RunCost:
    cfg = run.cfg
    counts = parameter_counts(cfg.model)
    fpt = flops_per_token(cfg.model, cfg.sequence_length)
    tokens = cfg.steps * cfg.batch_tokens
    half = uses_bf16(run, hardware)
    weight_bytes = 2 if half else 4
    peak = hardware.peak_flops
    return RunCost(
        run=run,
        params=counts.total,
        nonembedding_params=counts.nonembedding,
        flops_per_token=fpt,
        tokens=tokens,
        steps=cfg.steps,
        snapshots=len(snapshot_steps(cfg.checkpoint, cfg.steps)),
        snapshot_bytes=counts.total * weight_bytes,
        state_bytes=counts.total * (weight_bytes + 12),
        states_kept=min(cfg.checkpoint.keep_last, len(state_steps(cfg.checkpoint, cfg.steps))),
        device_hours=None if peak is None else fpt * tokens / (peak * hardware.mfu) / 3600,
    )


@dataclasses.dataclass
class SuitePlan:
    suite: Suite
    costs: list[RunCost]

    @property
    def total_flops(self) -> float:
        return sum(c.flops for c in self.costs)

    @property
    def total_device_hours(self) -> float | None:
        known = [c.device_hours for c in self.costs if c.device_hours is not None]
        return None if len(known) < len(self.costs) else sum(known)

    @property
    def total_disk(self) -> float:
        return sum(c.disk_bytes for c in self.costs)

    def notes(self) -> list[str]:
        out = []
        per_node = self.suite.config.hardware.devices_per_node
        for tp in sorted({c.run.tensor_parallel for c in self.costs}):
            if tp > 1 and per_node % tp:
                names = [c.run.name for c in self.costs if c.run.tensor_parallel == tp]
                out.append(
                    f"TP {tp} does not divide {per_node} devices per node: tensor-parallel groups of"
                    f" {', '.join(names)} span nodes"
                )
        budgets = {c.run.tokens for c in self.costs}
        short = [c for c in self.costs if c.tokens < c.run.tokens]
        if short:
            worst = max(short, key=lambda c: (c.run.tokens - c.tokens) / c.run.tokens)
            out.append(
                f"runs train whole batches: up to {worst.run.tokens - worst.tokens:,} tokens below the"
                f" budget ({worst.run.name}: {worst.steps:,} steps × {worst.run.cfg.batch_tokens:,})"
            )
        if len(budgets) > 1:
            out.append(f"{len(budgets)} token budgets: each is a separate run (for L(N, D) fits)")
        return out

    def render(self, markdown: bool = False) -> str:
        cfg = self.suite.config
        hw = cfg.hardware
        gpu = hw.is_gpu
        dev = "GPUs" if gpu else "devices"
        headers = [
            "run",
            "params",
            "FLOPs",
            "tokens",
            "steps",
            "batch",
            dev,
            "TP×DP",
            f"{'GPU' if gpu else 'device'}-h",
            "wall",
            "ckpts",
            "disk",
        ]
        rows = []
        for c in self.costs:
            r = c.run
            rows.append(
                [
                    r.name,
                    si(c.params),
                    f"{c.flops:.3g}",
                    si(c.tokens),
                    f"{c.steps:,}",
                    si(r.cfg.batch_tokens),
                    f"{r.devices}",
                    f"{r.tensor_parallel}×{r.data_parallel}",
                    "–" if c.device_hours is None else hours(c.device_hours),
                    _wall(c.wall_hours),
                    f"{c.snapshots}+{c.states_kept}",
                    nbytes(c.disk_bytes),
                ]
            )
        total_h = self.total_device_hours
        wall = None if total_h is None else sum(c.wall_hours or 0.0 for c in self.costs)
        rows.append(
            [
                f"total ({len(self.costs)} runs)",
                "",
                f"{self.total_flops:.3g}",
                si(sum(c.tokens for c in self.costs)),
                f"{sum(c.steps for c in self.costs):,}",
                "",
                f"max {max(c.run.devices for c in self.costs)}",
                "",
                "–" if total_h is None else hours(total_h),
                _wall(wall),
                f"{sum(c.snapshots + c.states_kept for c in self.costs):,}",
                nbytes(self.total_disk),
            ]
        )
        peak = hw.peak_flops
        price = (
            f"{hw.device} at {peak / 1e12:g} TFLOP/s peak × MFU {hw.mfu:g}"
            if peak
            else f"{hw.device}: no peak FLOP/s known (set hardware.peak_tflops), no device-hours"
        )
        head = [
            f"suite {cfg.name} ({shown_path(self.suite.path)}): {len(self.costs)} runs"
            f" under {self.suite.root}",
            f"priced on {price}; {hw.devices_per_node} device(s) per node",
            "FLOPs = trilm.model.flops.flops_per_token (6·(block linears + LM head) + attention) × tokens",
            "wall = device-hours ÷ devices, runs one after another; ckpts = model snapshots + states kept",
            "disk = snapshots at the training dtype + states (weights, Adam moments, fp32 master under bf16)",
            "",
        ]
        body = table(headers, rows, markdown=markdown)
        notes = [f"note: {n}" for n in self.notes()]
        return "\n".join([*head, body, *(["", *notes] if notes else [])])


def _wall(value: float | None) -> str:
    if value is None:
        return "–"
    if value >= 48:
        return f"{value / 24:.1f}d"
    if value >= 1:
        return f"{value:.1f}h"
    return f"{value * 60:.0f}m"


def plan_suite(suite: Suite) -> SuitePlan:
    return SuitePlan(suite, [run_cost(r, suite.config.hardware) for r in suite.runs])
