"""ZeRO resharding: a ZeRO-1 run saved at DP=2 resumes at DP=1 and back at DP=2 (DeepSpeed's universal
checkpoint), with the loss trajectory of the uninterrupted DP=2 run and the data continuing at its sample."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from trilm.testing.cluster import run_distributed

from .conftest import tiny_config

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _fit(cfg):
    from trilm.train.trainer import Trainer

    return Trainer(cfg).fit().resumed_from


class _Stop(Exception):
    pass


def _fit_until(cfg, stop_after: int):
    """Train and die right after the state of ``stop_after`` is written (an interrupted job)."""
    from trilm.train.trainer import Trainer

    class Interrupted(Trainer):
        def _save_state(self, engine, step, counters):
            super()._save_state(engine, step, counters)
            if step == stop_after:
                raise _Stop

    with pytest.raises(_Stop):
        Interrupted(cfg).fit()


def _losses(run) -> dict[int, float]:
    out = {}
    for line in (run / "logs/metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "loss" in record:
            out[record["step"]] = record["loss"]
    return out


def _events(run, name):
    lines = (run / "logs/events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


def test_zero1_resumes_2_to_1_to_2(prepared, tmp_path):
    overrides = {"tokens": 1024 * 24, "zero_stage": 1, "log.every": 1, "checkpoint.keep_last": 10}
    straight = tiny_config(prepared, tmp_path / "straight", **overrides)
    run_distributed(_fit, 2, straight)

    chain = tmp_path / "chain"  # the same run, killed after step 8 ...
    shutil.copytree(tmp_path / "straight", chain)
    for sub in ("state", "snapshots"):
        for path in (chain / sub).glob("step-*"):
            if int(path.name.split("-")[1]) > 8:
                shutil.rmtree(path)
    (chain / "logs").rename(tmp_path / "straight-logs")
    cfg = straight.replace(run_dir=str(chain))
    _fit_until(cfg, 16)  # ... resumed on one process up to step 16, killed again ...
    assert run_distributed(_fit, 2, cfg) == [16, 16]  # ... and finished on two

    want, got = _losses(tmp_path / "straight"), _losses(chain)
    assert sorted(got) == list(range(9, 25))
    for step in got:  # the same batches; only the order of the gradient sums differs
        assert got[step] == pytest.approx(want[step], rel=2e-5, abs=0), step
    resumes = _events(chain, "resume")
    global_batch = cfg.global_batch
    assert [(e["step"], e["saved_dp_size"], e["dp_size"], e["samples"]) for e in resumes] == [
        (8, 2, 1, 8 * global_batch),
        (16, 1, 2, 16 * global_batch),
    ]
    assert all("universal checkpoint" in e["detail"] for e in resumes)
    assert not list((chain / "state").glob(".universal-*"))  # conversions are removed once loaded
    final = json.loads((chain / "state/step-24/trainer_state.json").read_text())
    assert final["dp_size"] == 2 and final["data"]["samples_consumed"] == 24 * global_batch
    a = load_file(str(tmp_path / "straight/snapshots/step-24/model.safetensors"))
    b = load_file(str(chain / "snapshots/step-24/model.safetensors"))
    for key in a:  # Adam moments and fp32 master weights came through both conversions
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=2e-4, msg=key)


def test_universal_layout_facts_come_from_the_block_spec():
    """The row-parallel and replicated patterns handed to DeepSpeed's converter pick out exactly the
    training decoder's row-parallel linears (split along inputs) and its norm gains (whole on every rank):
    read from trilm.model.spec, so a renamed or added linear cannot be merged along the wrong axis."""
    import re

    from trilm.model import build_model
    from trilm.model.spec import LINEARS
    from trilm.train.reshard import UNIVERSAL_INFO

    names = [n for n, _ in build_model("trilm-nano", tp=1).named_parameters()]
    (row,) = UNIVERSAL_INFO["parameter_with_row_parallelism_patterns"]
    (replicated,) = UNIVERSAL_INFO["tp_replicated_parameter_patterns"]
    rows = {lin.leaf for lin in LINEARS if lin.parallel == "row"}
    assert rows == {"wo", "w_down"}
    assert {n for n in names if re.match(row, n)} == {n for n in names if n.split(".")[-2] in rows}
    assert {n for n in names if re.match(replicated, n)} == {n for n in names if n.endswith("norm.weight")}
    assert any(re.match(replicated, n) for n in names if n == "norm.weight")
