"""What a run will do, computed before anything heavy: the ``--dry-run`` report.

The memory estimate is per device and counts what dominates at scale: weights, gradients and Adam state
(sharded by ZeRO stage across data-parallel ranks and by tensor parallelism) plus the activations a
micro-batch keeps for backward, with and without activation recompute. Per token and block the decoder
keeps about 3·h values per sub-block outside the tensor-parallel regions (norm input and outputs; split
over TP under sequence parallelism) and 3·q + 3·kv + 5·ffn inside them (q, k, v, rotated q/k, attention
output, the SwiGLU gate/up/product; q and kv = heads × head dim of that block, per-layer shapes honoured):
counted with ``saved_tensors_hooks`` on the real block.
A recomputed block keeps only its input, plus one block's activations while it is being recomputed. TriLM
keeps the same activations as FloatLM (``QuantizedLinear`` saves the latent weight, not W̃). It is an
estimate, stated as such.
"""

from __future__ import annotations

import dataclasses

from trilm.model.flops import flops_per_token, parameter_counts
from trilm.schedule import Schedule
from trilm.train.config import TrainConfig
from trilm.train.convert import conversion_schedule, describe_recipe
from trilm.train.engine import use_bf16
from trilm.train.save_steps import snapshot_steps, state_steps
from trilm.train.state import parent_config


@dataclasses.dataclass
class RunPlan:
    cfg: TrainConfig
    dp_size: int
    tp_size: int
    source_family: str = ""
    """The family of the model ``init_from`` names, where the caller has it open (a conversion's schedule
    peaks at ``convert.lr_scale`` × ``optim.lr``)."""

    @property
    def accumulation(self) -> int:
        return self.cfg.accumulation(self.dp_size)

    def recompute_blocks(self, recompute: int | str | None = None) -> int:
        value = self.cfg.recompute if recompute is None else recompute
        return self.cfg.model.layers if value == "all" else int(value)

    def memory_gb(self, recompute: int | str | None = None) -> dict[str, float]:
        """Per-device estimate in GB; ``recompute`` overrides the config's (a number of blocks or "all")."""
        cfg, tp, dp = self.cfg, self.tp_size, self.dp_size
        params = parameter_counts(cfg.model).total / tp
        half = use_bf16(cfg)
        weight_bytes = 2 if half else 4
        grads = params * (2 if half else 4)
        master = params * 4 if half else 0
        adam = params * 8
        stage = cfg.zero_stage
        if stage >= 1:
            adam /= dp
            master /= dp
        if stage >= 2:
            grads /= dp
        m = cfg.model
        tokens = cfg.micro_batch * cfg.sequence_length
        outside = tp if cfg.parallel.sequence_parallel else 1
        hd = m.head_dim
        per_block = []
        for shape in m.layer_shapes():
            values = 0.0
            if shape.kv_heads:
                values += 3 * m.hidden / outside + (3 * shape.heads * hd + 3 * shape.kv_heads * hd) / tp
            if shape.ffn:
                values += 3 * m.hidden / outside + 5 * shape.ffn / tp
            per_block.append(tokens * values * weight_bytes)
        block_input = tokens * m.hidden / outside * weight_bytes
        logits = tokens * m.padded_vocab / tp * 4 * 2
        n = self.recompute_blocks(recompute)
        acts = sum(per_block[n:]) + n * block_input + (max(per_block[:n]) if n else 0) + logits
        out = {
            "weights": params * weight_bytes,
            "grads": grads,
            "master+adam": master + adam,
            "activations": acts,
        }
        out = {k: v / 1e9 for k, v in out.items()}
        out["total"] = sum(out.values())
        return out

    def report(self) -> str:
        cfg = self.cfg
        counts = parameter_counts(cfg.model)
        fpt = flops_per_token(cfg.model, cfg.sequence_length)
        converts_at = planned_start(cfg, self.source_family)
        if converts_at is None:
            sched = Schedule.for_optimizer(cfg.optim, cfg.schedule, cfg.steps)
        else:
            sched = conversion_schedule(cfg, converts_at)
        snaps = snapshot_steps(cfg.checkpoint, cfg.steps)
        states = state_steps(cfg.checkpoint, cfg.steps)
        start = _branch_step(cfg.branch_from)
        if start is not None:  # a branch writes only what comes after its start
            snaps, states = [s for s in snaps if s > start], [s for s in states if s > start]
        mem = self.memory_gb()
        m = cfg.model
        lines = [
            f"run dir            {cfg.run_dir}",
            f"model              {m.name} ({m.family}; hidden {m.hidden}, ffn {m.ffn}, heads {m.heads}, "
            f"layers {m.layers}, vocab {m.padded_vocab})",
            f"quantization       {m.weight_format} weights, scale group {m.quant.scale_group}, "
            f"partitions {m.scale_partitions(self.tp_size)}, activations "
            f"{m.quant.activation_bits or 'float'}",
            f"parameters         {counts.total:,} (non-embedding {counts.nonembedding:,})",
            f"FLOPs/token        {fpt:.4g} (training, seq {cfg.sequence_length})",
            f"parallelism        TP {self.tp_size} × DP {self.dp_size}, ZeRO stage {cfg.zero_stage}, "
            f"{'bf16' if use_bf16(cfg) else 'fp32'}",
            f"batch              {cfg.batch_tokens:,} tokens = {cfg.global_batch} × {cfg.sequence_length}; "
            f"micro-batch {cfg.micro_batch} × accumulation {self.accumulation} per DP rank",
            f"steps              {cfg.steps:,} ({cfg.steps * cfg.batch_tokens:,} tokens, "
            f"{cfg.steps * cfg.batch_tokens / counts.total:.1f} tokens/param, "
            f"{fpt * cfg.steps * cfg.batch_tokens:.3g} FLOPs)",
            f"lr schedule        peak {sched.peak_lr:g}, warmup {sched.warmup_steps} steps, "
            + (
                f"constant, then a {cfg.schedule.cooldown_shape} cooldown over the last"
                f" {sched.cooldown_steps} steps (WSD)"
                if cfg.schedule.kind == "wsd"
                else cfg.schedule.decay
            )
            + f" to {sched.peak_lr * cfg.optim.min_lr_ratio:g}"
            + ("" if converts_at is None else f" (the conversion's, from step {converts_at:,})"),
        ]
        for ev in sched.events():
            lines.append(f"  event            step {ev.step}: {ev.name} ({ev.detail})")
        if converts_at is not None:
            lines.append(f"conversion recipe  {describe_recipe(cfg)}")
        if start is not None:
            lines.append(
                f"starts from        {cfg.branch_from} (a branch: trains steps {start:,}–{cfg.steps:,})"
            )
        lines += [
            f"snapshots          {len(snaps)} at steps {_compact(snaps)}",
            f"resumable states   every {cfg.checkpoint.state_every} steps (+ last), keep last "
            f"{cfg.checkpoint.keep_last}: {_compact(states)}",
            "memory / device    " + _memory_line(mem) + f" (estimate; {self._recompute_text()})",
        ]
        if self.recompute_blocks() != m.layers:
            lines.append(
                "  with recompute   " + _memory_line(self.memory_gb("all")) + " (recompute=all: every block)"
            )
        if self.recompute_blocks() != 0:
            lines.append("  without          " + _memory_line(self.memory_gb(0)) + " (recompute=0)")
        return "\n".join(lines)

    def _recompute_text(self) -> str:
        n = self.recompute_blocks()
        sp = ", sequence parallel" if self.cfg.parallel.sequence_parallel else ""
        if n == 0:
            return f"no activation recompute{sp}"
        return f"activation recompute in {n} of {self.cfg.model.layers} blocks{sp}"


def _memory_line(mem: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f} GB" for k, v in mem.items())


def _compact(steps: list[int], limit: int = 14) -> str:
    if len(steps) <= limit:
        return ", ".join(map(str, steps))
    head = ", ".join(map(str, steps[: limit - 3]))
    return f"{head}, …, {', '.join(map(str, steps[-2:]))}"


def _branch_step(branch_from: str) -> int | None:
    """The step of a ``branch_from`` state directory (``…/state/step-N``), or None without one."""
    if not branch_from:
        return None
    name = branch_from.rstrip("/").rsplit("/", 1)[-1]
    return int(name[5:]) if name.startswith("step-") and name[5:].isdigit() else None


def planned_start(cfg: TrainConfig, source_family: str = "") -> int | None:
    """Where the conversion phase of ``cfg`` starts, without training (the dry run's plan): 0 for
    ``init_from`` a model of another family (``source_family``: the opener knows it), N for
    ``branch_from`` a state of a run of another family (its config is read), None when it converts nothing
    or the parent's config cannot be read (the trainer then says why)."""
    if cfg.init_from:
        return 0 if source_family and source_family != cfg.model.family else None
    parent = parent_config(cfg.branch_from) if cfg.branch_from else None
    step = _branch_step(cfg.branch_from)
    return step if parent is not None and parent.model.family != cfg.model.family else None
