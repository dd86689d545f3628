"""``trilm train --config RUN.yaml [key=value ...] [--dry-run]`` (same as ``python -m trilm.train``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trilm.config import ConfigError
from trilm.data.shards import TokenShards
from trilm.parallel import current_parallel, init_parallel, shutdown_parallel
from trilm.train.config import TrainConfig
from trilm.train.init_from import open_init_from, resolve_init_from
from trilm.train.plan import RunPlan
from trilm.train.state import resolve_branch_from


def build_parser(parser: argparse.ArgumentParser, command: str = "train") -> None:
    parser.add_argument(
        "--config", required=True, help="run YAML (TrainConfig), e.g. configs/train/quickstart-trilm.yaml"
    )
    parser.add_argument(
        "overrides", nargs="*", help="dotted overrides, e.g. tokens=1e6 parallel.tensor_parallel=2"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the plan (config, sizes, schedule, memory)"
    )
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)


def load_config(args) -> TrainConfig:
    """The run config as written, with the overrides (its ``init_from`` is resolved where it is used)."""
    return TrainConfig.from_yaml(args.config, list(args.overrides))


def _data_line(key: str, path: str, cfg: TrainConfig) -> str:
    if not Path(path).is_dir():
        return f"data.{key:<14} {path}: not prepared yet (trilm data prepare)"
    try:
        shards = TokenShards.open(path)
    except ConfigError as exc:
        return f"data.{key:<14} {exc}"
    seqs = shards.num_sequences(cfg.sequence_length)
    line = f"data.{key:<14} {path}: {shards.num_tokens:,} tokens, {seqs:,} sequences"
    if key == "train_dir":
        line += f", {cfg.steps * cfg.global_batch / max(seqs, 1):.2f} epochs"
    return line


def dry_run(cfg: TrainConfig) -> str:
    """The plan without building the model or touching the run directory (``init_from`` is resolved and
    its weights read and verified: a damaged one is refused here, not after the run directory is made; a
    conversion's recipe is filled in as the trainer fills it)."""
    family = ""
    source = open_init_from(cfg)
    cfg = resolve_branch_from(resolve_init_from(cfg, source))
    if source is not None:
        source.weights.float_state()
        family = source.config.family
    info = init_parallel(cfg.parallel)
    lines = [
        "# resolved config",
        cfg.replace(model=cfg.model.resolved(info.tp_size)).to_yaml().rstrip(),
        "",
        "# plan",
        RunPlan(cfg, info.dp_size, info.tp_size, source_family=family).report(),
    ]
    lines += [
        _data_line(key, path, cfg)
        for key, path in (("train_dir", cfg.data.train_dir), ("valid_dir", cfg.data.valid_dir))
        if path
    ]
    return "\n".join(lines)


def run(args) -> int:
    """Every path out (done, error, Ctrl-C) destroys the process group: a live NCCL group makes the
    process hang at exit."""
    try:
        return _run(args)
    finally:
        shutdown_parallel()


def _run(args) -> int:
    cfg = load_config(args)
    if args.dry_run:
        text = dry_run(cfg)
        if current_parallel().rank == 0:
            print(text)
        return 0
    # deferred for start-up time: megatron (keeps `trilm train --help` fast)
    from trilm.train.trainer import Trainer

    summary = Trainer(cfg).fit()
    if current_parallel().rank == 0:
        print(
            f"done: {summary.steps} steps in {summary.run_dir} (resumed from step {summary.resumed_from}, "
            f"skipped {summary.skipped_steps}); final train loss {summary.final_loss}"
        )
        for step, loss in sorted(summary.val_losses.items()):
            print(f"  step {step:>6}  val loss {loss:.4f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pretrain", description="Pretrain a TriLM / FloatLM / BiLM")
    build_parser(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ConfigError as exc:
        print(f"pretrain: error: {exc}", file=sys.stderr)
        return 2
