"""Two gloo processes: tensor parallel and data parallel (ZeRO) training, and resume at another DP size."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from trilm.store.layout import COMPLETE
from trilm.testing.cluster import run_distributed

from .conftest import tiny_config

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _fit(cfg):
    from trilm.train.trainer import Trainer

    summary = Trainer(cfg).fit()
    return summary.val_losses, summary.resumed_from


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("tp2", {"parallel.tensor_parallel": 2, "zero_stage": 1}),
        ("dp2-zero2", {"zero_stage": 2}),
    ],
)
def test_two_process_training_learns(prepared, tmp_path, name, overrides):
    cfg = tiny_config(prepared, tmp_path / name, tokens=1024 * 16, **overrides)
    (val, _), (val_other, _) = run_distributed(_fit, 2, cfg)
    assert val == val_other  # every rank reports the same all-reduced validation loss
    assert val[16] < val[0] - 0.5
    meta = json.loads((tmp_path / name / "snapshots/step-16/config.json").read_text())
    if name == "tp2":
        assert meta["model"]["quant"]["partitions"] == 2


def test_resume_at_a_different_data_parallel_size(prepared, tmp_path):
    cfg = tiny_config(prepared, tmp_path / "dp2", tokens=1024 * 16, **{"checkpoint.keep_last": 10})
    run_distributed(_fit, 2, cfg)
    # Pretend the DP=2 job died right after step 8, then continue it with a single process.
    resumed_dir = tmp_path / "dp1"
    shutil.copytree(tmp_path / "dp2", resumed_dir)
    for sub in ("state", "snapshots"):
        for path in (resumed_dir / sub).iterdir():
            if int(path.name.split("-")[1]) > 8:
                shutil.rmtree(path)
    from trilm.train.trainer import Trainer

    summary = Trainer(cfg.replace(run_dir=str(resumed_dir))).fit()
    assert summary.resumed_from == 8
    state = json.loads((resumed_dir / "state/step-16/trainer_state.json").read_text())
    assert state["dp_size"] == 1 and state["data"]["samples_consumed"] == 16 * cfg.global_batch
    assert (resumed_dir / "state/step-16" / COMPLETE).exists()
    a = load_file(str(tmp_path / "dp2/snapshots/step-16/model.safetensors"))
    b = load_file(str(resumed_dir / "snapshots/step-16/model.safetensors"))
    for key in a:  # same samples in the same order; only the reduction order differs
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=2e-4)
