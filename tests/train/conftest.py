"""Fixtures of the training tests: the embedded corpus prepared once, and a tiny run config on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from trilm.data.pipeline import prepare_embedded
from trilm.train.config import TrainConfig


@pytest.fixture(scope="session")
def prepared(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("train-data")
    return prepare_embedded(out, vocab_size=512, workers=1, progress=False)


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
    """The 2-run CPU suite (trilm-nano, floatlm-nano) that the SLURM tests and ``benchmarks/multinode.py``
    submit as an array with ``trilm suite launch --slurm``; returns the suite file."""
    from tests.suite.conftest import write_suite

    directory.mkdir(parents=True, exist_ok=True)
    return write_suite(directory, prepared, name="slurmtoy", steps=SUITE_STEPS, sizes=[{"name": "nano"}])


def _launch_to_end(tmp_path_factory, prepared, name: str, launcher_factory) -> Path:
    from benchmarks.cluster.drills import run_to_end
    from benchmarks.cluster.processes import ProcessSet

    root = tmp_path_factory.mktemp(name)
    config = multinode_config(prepared, root / "run")
    with ProcessSet(root / "logs") as processes:
        outcome = run_to_end(processes, launcher_factory(), config, name, LAUNCH_TIMEOUT)
    assert outcome.codes == [0] * len(outcome.codes), outcome.tail()
    return root / "run"


@pytest.fixture(scope="session")
def one_node_run(tmp_path_factory, prepared) -> Path:
    """The reference: 1 node × 4 processes (torchrun), TP 2 × DP 2; its run directory."""
    from benchmarks.cluster.launchers import Torchrun

    return _launch_to_end(tmp_path_factory, prepared, "one-node", lambda: Torchrun(1, 4))


@pytest.fixture(scope="session")
def two_node_run(tmp_path_factory, prepared) -> Path:
    """The same run on 2 loopback nodes × 2 processes (torchrun, TP inside a node); its run directory."""
    from benchmarks.cluster.launchers import Torchrun

    return _launch_to_end(tmp_path_factory, prepared, "two-nodes", lambda: Torchrun(2, 2))
