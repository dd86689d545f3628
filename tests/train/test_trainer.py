"""Single-process training on the embedded corpus: learning, snapshots, NaN guard, dry run, resume rules."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from trilm.cli import main as trilm_main
from trilm.config import ConfigError
from trilm.store.integrity import complete_steps, latest_complete
from trilm.store.layout import COMPLETE
from trilm.train.models import load_model
from trilm.train.trainer import Trainer, TrainingAborted

from .conftest import tiny_config


@pytest.mark.parametrize("family", ["trilm", "floatlm"])
def test_tiny_run_learns_and_writes_its_suite(prepared, tmp_path, family):
    cfg = tiny_config(prepared, tmp_path / "run", family)
    summary = Trainer(cfg).fit()
    assert summary.steps == 24 and summary.skipped_steps == 0
    assert summary.val_losses[24] < summary.val_losses[0] - 0.5
    snaps = [s for s, _ in complete_steps(tmp_path / "run" / "snapshots")]
    assert snaps == [0, 1, 2, 4, 8, 16, 24]
    assert [s for s, _ in complete_steps(tmp_path / "run" / "state")] == [20, 24]
    meta = json.loads((tmp_path / "run/snapshots/step-24/config.json").read_text())["meta"]
    assert (
        meta["tokens"] == 24 * 1024
        and meta["family"] == family
        and meta["val_loss"] == summary.val_losses[24]
    )
    model = load_model(tmp_path / "run/snapshots/step-24")
    assert model.cfg.quant.partitions == (1 if family == "trilm" else 0)
    records = [json.loads(x) for x in (tmp_path / "run/logs/metrics.jsonl").read_text().splitlines()]
    record = next(r for r in records if "loss" in r)
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "tflops", "data_wait", "memory_gb"):
        assert record[key] is not None, key


class _NaNAt(Trainer):
    bad_steps: frozenset[int] = frozenset()

    def _micro_loss(self, engine, step, chunk):
        loss = super()._micro_loss(engine, step, chunk)
        return loss * float("nan") if step in self.bad_steps else loss


def test_nonfinite_steps_are_skipped_then_abort(prepared, tmp_path):
    cfg = tiny_config(prepared, tmp_path / "a", tokens=1024 * 10)
    trainer = _NaNAt(cfg)
    trainer.bad_steps = frozenset({3, 4})
    summary = trainer.fit()
    assert summary.skipped_steps == 2 and summary.final_loss is not None
    events = [json.loads(x) for x in (tmp_path / "a/logs/events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "nonfinite_loss"] == [3, 4]
    weights = load_file(str(tmp_path / "a/snapshots/step-10/model.safetensors"))
    assert all(torch.isfinite(t).all() for t in weights.values())

    cfg = tiny_config(prepared, tmp_path / "b", tokens=1024 * 10).with_overrides(["log.max_nonfinite=3"])
    trainer = _NaNAt(cfg)
    trainer.bad_steps = frozenset({5, 6, 7})
    with pytest.raises(TrainingAborted, match="NaN/inf for 3 consecutive steps"):
        trainer.fit()
    assert latest_complete(tmp_path / "b/state")[0] == 4


def test_checkpoint_without_marker_is_skipped_and_config_change_refused(prepared, tmp_path):
    run = tmp_path / "run"
    cfg = tiny_config(prepared, run, tokens=1024 * 8, **{"checkpoint.keep_last": 5})
    Trainer(cfg).fit()
    shutil.copytree(run / "state/step-8", run / "state/step-12")
    (run / "state/step-12" / COMPLETE).unlink()
    assert latest_complete(run / "state")[0] == 8
    longer = tiny_config(prepared, run, tokens=1024 * 12, **{"checkpoint.keep_last": 5})
    with pytest.raises(ConfigError, match="refusing to resume: tokens differ"):
        Trainer(longer).fit()


def test_dry_run_prints_the_plan(prepared, tmp_path, capsys):
    path = tmp_path / "run.yaml"
    tiny_config(prepared, tmp_path / "run").to_yaml(path)
    assert trilm_main(["train", "--config", str(path), "--dry-run", "schedule.lr_drop_at=0.5"]) == 0
    out = capsys.readouterr().out
    for text in (
        "# resolved config",
        "FLOPs/token",
        "steps              24",
        "step 12: lr_drop",
        "snapshots          7 at steps 0, 1, 2, 4, 8, 16, 24",
        "memory / device",
        "no activation recompute",
        "with recompute   ",
        "sequences",
    ):
        assert text in out, text
    assert not (tmp_path / "run").exists()
