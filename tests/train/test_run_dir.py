"""Run-directory safety, each case tried as a careless user would: a damaged newest state, a restart with
another config before the first state, two trainings on one directory, a corrupted token shard."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from trilm.config import ConfigError
from trilm.data.errors import DataError
from trilm.train.checkpoint import RunLock
from trilm.train.trainer import Trainer

from .conftest import tiny_config

ROOT = Path(__file__).resolve().parents[2]


def _flip_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 8] = bytes(b ^ 0xFF for b in data[mid : mid + 8])
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garbage(path: Path) -> None:
    path.write_text('{"step": 12, "tokens"')


@pytest.fixture(scope="module")
def finished_run(prepared, tmp_path_factory):
    """A 12-step run with states at 4, 8 and 12 (and the weights it ends with)."""
    run = tmp_path_factory.mktemp("finished") / "run"
    cfg = tiny_config(prepared, run, tokens=1024 * 12, **{"checkpoint.keep_last": 5})
    Trainer(cfg).fit()
    from trilm.parallel import shutdown_parallel

    shutdown_parallel()
    return cfg, run


@pytest.mark.parametrize(
    ("damage", "victim"),
    [
        (_flip_middle, "mp_rank_00_model_states.pt"),  # same size, altered bytes: the CRC catches it
        (_garbage, "trainer_state.json"),
        (_truncate, "rng-rank0.pt"),
    ],
    ids=["pt-bytes-altered", "json-garbage", "rng-truncated"],
)
def test_damaged_newest_state_falls_back_to_the_previous_one(finished_run, tmp_path, damage, victim):
    cfg, original = finished_run
    run = tmp_path / "run"
    shutil.copytree(original, run)
    damage(run / "state/step-12" / victim)
    with pytest.warns(RuntimeWarning, match=f"step-12/{victim}"):
        summary = Trainer(cfg.replace(run_dir=str(run))).fit()
    assert summary.resumed_from == 8
    events = [json.loads(x) for x in (run / "logs/events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "state_skipped" and victim in e["detail"] for e in events)
    a = load_file(str(original / "snapshots/step-12/model.safetensors"))
    b = load_file(str(run / "snapshots/step-12/model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # steps 9-12 replayed exactly


def test_no_loadable_state_is_refused_not_restarted(finished_run, tmp_path):
    cfg, original = finished_run
    run = tmp_path / "run"
    shutil.copytree(original, run)
    for step in (4, 8, 12):
        _truncate(run / f"state/step-{step}/mp_rank_00_model_states.pt")
    with pytest.warns(RuntimeWarning), pytest.raises(ConfigError, match="no loadable state"):
        Trainer(cfg.replace(run_dir=str(run))).fit()


class _KilledAfterSnapshot(Trainer):
    def _save_snapshot(self, engine, step, train_loss, val_loss):
        super()._save_snapshot(engine, step, train_loss, val_loss)
        if step == 2:
            raise KeyboardInterrupt


def test_restart_with_another_config_before_the_first_state_is_refused(prepared, tmp_path):
    run = tmp_path / "run"
    cfg = tiny_config(prepared, run, tokens=1024 * 8)
    with pytest.raises(KeyboardInterrupt):
        _KilledAfterSnapshot(cfg).fit()
    assert (run / "snapshots/step-2/COMPLETE").exists() and not list((run / "state").glob("step-*"))
    other = cfg.with_overrides(["optim.lr=1e-3", "model.init_std=0.01"])
    with pytest.raises(ConfigError, match=r"refusing to resume: model.init_std, optim.lr differ"):
        Trainer(other).fit()
    shutil.rmtree(run / "logs")
    (run / "resolved_config.yaml").unlink()  # a directory with checkpoints but no record of its config
    with pytest.raises(ConfigError, match="holds checkpoints but no resolved_config.yaml"):
        Trainer(cfg).fit()


def test_second_training_on_a_run_dir_is_refused_and_a_killed_holder_leaves_no_stale_lock(prepared, tmp_path):
    run = tmp_path / "run"
    cfg = tiny_config(prepared, run, tokens=1024 * 2)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from trilm.train.checkpoint import RunLock; lock = RunLock(sys.argv[1]); "
            "lock.acquire(); print('locked', flush=True); time.sleep(600)",
            str(run),
        ],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert holder.stdout.readline().strip() == b"locked"
        with pytest.raises(
            ConfigError, match=rf"another training is using this run directory \(pid {holder.pid}"
        ):
            Trainer(cfg).fit()
        assert not (run / "logs").exists()  # refused before writing anything
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    assert Trainer(cfg).fit().steps == 2  # the kernel dropped the dead holder's lock
    with RunLock(run):  # and the finished training released its own
        pass


def _corrupt_copy(prepared, tmp_path) -> Path:
    data = tmp_path / "train"
    shutil.copytree(prepared["train"], data)
    return data


def test_corrupted_shard_fails_with_its_name(prepared, tmp_path):
    data = _corrupt_copy(prepared, tmp_path)
    shard = sorted(data.glob("*.bin"))[0]
    tokens = np.memmap(shard, dtype=np.uint16, mode="r+")
    tokens[: len(tokens) // 2] = 0xFFFF  # same size, ids outside the 512-token vocabulary
    tokens.flush()
    del tokens
    cfg = tiny_config(prepared, tmp_path / "run", tokens=1024 * 2, **{"data.train_dir": str(data)})
    with pytest.raises(
        DataError, match=rf"{shard.name}: token \d+ is id 65535, outside the vocabulary of 512"
    ):
        Trainer(cfg).fit()
    verified = cfg.with_overrides(["data.verify_checksums=true"])
    with pytest.raises(DataError, match=rf"{shard.name}: checksum mismatch"):
        Trainer(verified)


def test_checksum_option_catches_in_vocabulary_corruption(prepared, tmp_path):
    data = _corrupt_copy(prepared, tmp_path)
    shard = sorted(data.glob("*.bin"))[0]
    tokens = np.memmap(shard, dtype=np.uint16, mode="r+")
    tokens[:64] = tokens[64:128].copy()  # plausible ids: only the checksum can tell
    tokens.flush()
    del tokens
    cfg = tiny_config(
        prepared, tmp_path / "run", **{"data.train_dir": str(data), "data.verify_checksums": True}
    )
    with pytest.raises(DataError, match=rf"{shard.name}: checksum mismatch"):
        Trainer(cfg)
