"""The small runs that the multi-node tests and ``benchmarks/train/multinode.py`` launch, defined once.

A tiny TriLM on the embedded corpus (:func:`tiny_config`), the same at tensor parallel 2 under ZeRO-1 for
the multi-node drills (:func:`multinode_config`), and the 2-run CPU suite submitted to SLURM as an array
(:func:`slurm_suite`, built by :func:`write_suite`). ``prepared`` is what
:func:`trilm.data.pipeline.prepare_embedded` returns (tokenizer, train and validation splits).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from trilm.testing.cluster.launchers import ROOT as CHECKOUT
from trilm.train.config import TrainConfig


def tiny_config(prepared: dict[str, Path], run_dir: Path, family: str = "trilm", **overrides) -> TrainConfig:
    """A run of a 2-layer, 64-wide model on 64-token sequences: seconds per run on one CPU core."""
    data = {
        "model": {"preset": f"{family}-nano", "vocab_size": 512},
        "data": {
            "train_dir": str(prepared["train"]),
            "valid_dir": str(prepared["validation"]),
            "tokenizer": str(prepared["tokenizer"]),
            "valid_sequences": 16,
        },
        "run_dir": str(run_dir),
        "seq_len": 64,
        "batch_tokens": 1024,
        "micro_batch": 8,
        "tokens": 1024 * 24,
        "zero_stage": 0,
        "optim": {"lr": 3e-3},
        "schedule": {"warmup": 2},
        "checkpoint": {"snapshot_every": 8, "state_every": 4, "keep_last": 2, "log_spaced_until": 4},
        "log": {"every": 4, "eval_every": 0, "tensorboard": False, "progress": False},
    }
    cfg = TrainConfig.from_dict(data)
    return cfg.with_overrides([f"{k}={v}" for k, v in overrides.items()]) if overrides else cfg


# ---- multi-node runs ------------------------------------------------------------------------------------
MULTINODE_STEPS = 16
SUITE_STEPS = 64
"""Steps of each run of the 2-run suite submitted to SLURM as one array: enough that a run is cancelled
mid-way once it has logged step 10 and written a state, whatever the load."""
LAUNCH_TIMEOUT = 900.0
"""Seconds a launch of four training processes may take: on a loaded 2-core machine importing torch,
megatron-core and DeepSpeed four times over takes minutes; a quiet one needs about 20 s."""


def multinode_config(prepared: dict[str, Path], run_dir: Path, **overrides) -> Path:
    """The tiny TriLM at tensor parallel 2 under ZeRO-1, every step logged, every state kept: the run the
    multi-node tests launch as 1 node × 4 processes, 2 nodes × 2, or 1 node × 2. Written next to the run
    directory; returns the YAML's path."""
    settings = {
        "tokens": 1024 * MULTINODE_STEPS,
        "parallel.tensor_parallel": 2,
        "zero_stage": 1,
        "log.every": 1,
        "checkpoint.keep_last": 10,
        **overrides,
    }
    path = run_dir.with_suffix(".yaml")
    tiny_config(prepared, run_dir, **settings).to_yaml(path)
    return path


def slurm_suite(directory: Path, prepared: dict[str, Path]) -> Path:
    """The 2-run CPU suite (trilm-nano, floatlm-nano) that the SLURM tests and
    ``benchmarks/train/multinode.py`` submit as an array with ``trilm suite launch --slurm``; returns the
    suite file."""
    directory.mkdir(parents=True, exist_ok=True)
    return write_suite(directory, prepared, name="slurmtoy", steps=SUITE_STEPS, sizes=[{"name": "nano"}])


def write_suite(
    directory: Path,
    prepared: dict[str, Path],
    *,
    name: str = "toy",
    families: tuple[str, ...] = ("trilm", "floatlm"),
    steps: int = 8,
    **extra,
) -> Path:
    """A suite of 1-2 layer models on 64-token sequences: a few seconds per run on one CPU core."""
    data = {
        "name": name,
        "root": str(directory / "runs"),
        "families": [
            {"name": f, "config": str(CHECKOUT / f"configs/train/quickstart-{f}.yaml")} for f in families
        ],
        "sizes": [
            {"name": "pico", "preset": "nano", "model": {"hidden": 32, "ffn": 96, "heads": 2, "layers": 1}},
            {"name": "nano"},
        ],
        "tokens": [1024 * steps],
        "seq_len": 64,
        "checkpoint": {"snapshot_every": 4, "log_spaced_until": 2, "state_every": 4, "keep_last": 2},
        "overrides": {
            "model": {"vocab_size": 512},
            "batch_tokens": 1024,
            "micro_batch": 16,
            "data": {"valid_sequences": 16},
            "schedule": {"warmup": 1},
            "log": {"every": 2, "tensorboard": False, "progress": False},
        },
        "data": {k: str(prepared[v]) for k, v in (("train_dir", "train"), ("valid_dir", "validation"))}
        | {"tokenizer": str(prepared["tokenizer"])},
        "hardware": {"device": "cpu", "peak_tflops": 0.2, "mfu": 0.25, "devices_per_node": 1},
    }
    data.update(extra)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
