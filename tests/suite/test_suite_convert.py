"""``trilm suite convert``: a WSD FloatLM of a toy suite continued as a TriLM from its cooldown start, killed
and resumed, and listed by status and analyse beside the float run's own cooldown and the TriLM from
scratch."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.suite.conftest import write_suite
from trilm.cli import main
from trilm.config import ConfigError
from trilm.parallel import shutdown_parallel
from trilm.schedule import ScheduleConfig
from trilm.store.layout import WEIGHTS_FILE
from trilm.suite import load_suite
from trilm.suite.convert import conversion_branches
from trilm.suite.cooldown import branch_state
from trilm.suite.launch import launch_local
from trilm.train.config import DistillConfig
from trilm.train.convert import CROSSOVER_SCHEDULE
from trilm.train.trainer import Trainer

PICO = {"name": "pico", "preset": "nano", "model": {"hidden": 32, "ffn": 96, "heads": 2, "layers": 1}}
BASE = {
    "model": {"vocab_size": 512},
    "batch_tokens": 1024,
    "micro_batch": 16,
    "data": {"valid_sequences": 16},
    "log": {"every": 1, "tensorboard": False, "progress": False},
    "schedule": {
        "kind": "wsd",
        "warmup": 2,
        "cooldown": 0.2,
        "lr_drop_at": None,
        "weight_decay_off_at": None,
    },
    "optim": {"min_lr_ratio": 0.0},
}
CHECKPOINTS = {"snapshot_every": 4, "log_spaced_until": 2, "state_every": 2, "keep_last": 2}


def _suite(tmp_path, prepared, conversions):
    return write_suite(
        tmp_path,
        prepared,
        families=("floatlm", "trilm"),
        steps=20,
        sizes=[PICO],
        overrides=BASE,
        checkpoint=CHECKPOINTS,
        conversions=conversions,
    )


class _Killed(RuntimeError):
    pass


class _DiesAtStep(Trainer):
    """A trainer that fails in the middle of a step, after it has written a state: a kill, in-process."""

    def __init__(self, cfg, at: int):
        super().__init__(cfg)
        self.at = at

    def _micro_loss(self, engine, step, chunk):
        if step == self.at:
            raise _Killed(f"killed in step {step}")
        return super()._micro_loss(engine, step, chunk)


def _weights(run_dir, step):
    return load_file(str(run_dir / "snapshots" / f"step-{step}" / WEIGHTS_FILE))


def test_a_wsd_float_run_converted_at_its_cooldown_start_resumes_exactly_and_is_listed(
    tmp_path, prepared, capsys
):
    path = _suite(tmp_path, prepared, [{"family": "trilm"}])
    suite = load_suite(path)
    assert suite.run("floatlm-pico").cfg.checkpoint.keep_states_at == [16]  # 20 steps, the last 4 cool down
    (branch,) = conversion_branches(suite)
    assert (branch.run.name, branch.spec.start, branch.run.cfg.steps) == ("floatlm-pico-to-trilm", 16, 20)
    assert branch.run.cfg.model.family == "trilm" and branch.run.cfg.convert.optimizer is None  # kept
    parent = suite.run("floatlm-pico")
    _assert_crossover(branch.run.cfg, parent)
    assert branch_state(branch)[0] == "waiting"

    launch_local(suite, suite.runs, progress=False, echo=lambda _: None)
    assert branch_state(branch)[0] == "ready"
    reference = branch.run.cfg.replace(run_dir=str(tmp_path / "reference"))
    try:
        assert Trainer(reference).fit().resumed_from == 16
        with pytest.raises(_Killed):
            _DiesAtStep(branch.run.cfg, at=19).fit()
    finally:
        shutdown_parallel()
    assert main(["suite", "status", str(path)]) == 0
    assert "conversion branches: 1 (1 stopped)" in capsys.readouterr().out

    assert main(["suite", "convert", str(path), "--no-progress"]) == 0  # its saved config is the suite's
    assert "1 resumed" in capsys.readouterr().out
    events = [json.loads(x) for x in (branch.run.run_dir / "logs" / "events.jsonl").read_text().splitlines()]
    assert [e["detail"].split("/")[-1] for e in events if e["event"] in ("branch", "resume")] == [
        "step-16",
        "step-18",
    ]
    a, b = _weights(tmp_path / "reference", 20), _weights(branch.run.run_dir, 20)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    assert main(["suite", "status", str(path)]) == 0
    status = capsys.readouterr().out
    assert "conversion branches: 1 (1 finished)" in status
    line = next(x for x in status.splitlines() if x.strip().startswith("floatlm-pico-to-trilm"))
    assert "floatlm-pico" in line and "(final)" in line
    assert main(["suite", "status", str(path), "--json"]) == 0
    (record,) = json.loads(capsys.readouterr().out)["branches"]
    assert record["conversion"] == "trilm" and record["start_step"] == 16 and record["state"] == "finished"

    assert main(["suite", "analyse", str(path), "--bootstrap", "0", "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "conversion branches at equal total tokens" in out
    table = (suite.root / "analysis" / "conversions.md").read_text()
    row = next(x for x in table.splitlines() if x.strip().startswith("floatlm-pico-to-trilm"))
    assert "trilm-pico" in row and "20%" in row  # compared with the TriLM from scratch; 4 of 20 steps
    assert (suite.root / "conversions.csv").is_file()
    assert "to-trilm" not in (suite.root / "results.csv").read_text()  # kept out of the family laws


def _assert_crossover(cfg, parent) -> None:
    """A branch by the crossover recipe: its own schedule and regularisation, the parent's rate, and the
    parent's snapshot at the branch point as its teacher."""
    assert cfg.schedule == CROSSOVER_SCHEDULE and cfg.optim.weight_decay == 0 and cfg.optim.min_lr_ratio == 0
    assert cfg.optim.lr == parent.cfg.optim.lr and cfg.convert.lr_scale == 1
    step = cfg.branch_from.rsplit("/", 1)[-1]
    assert cfg.distill == DistillConfig(teacher=str(parent.run_dir / "snapshots" / step))


def test_the_recipe_gives_way_to_overrides_and_as_written_keeps_the_parents(tmp_path, prepared):
    linear = {"schedule": {"kind": "decay", "decay": "linear", "warmup": 0}, "optim": {"weight_decay": 0.05}}
    as_written = {"convert": {"recipe": "as_written"}}
    entries = [{"name": "linear", "overrides": linear}, {"name": "written", "overrides": as_written}]
    suite = load_suite(_suite(tmp_path, prepared, entries))
    parent = suite.run("floatlm-pico")
    mine, written = (b.run.cfg for b in conversion_branches(suite))
    assert mine.schedule == ScheduleConfig(kind="decay", decay="linear", warmup=0)
    assert mine.optim.weight_decay == 0.05 and mine.distill.enabled and mine.optim.min_lr_ratio == 0
    assert written.schedule == parent.cfg.schedule and written.optim == parent.cfg.optim
    assert not written.distill.enabled


def test_conversions_are_checked_when_the_suite_loads(tmp_path, prepared):
    with pytest.raises(ConfigError, match=r"conversions\[0\]\.parents: bilm is not a family of the suite"):
        load_suite(_suite(tmp_path, prepared, [{"family": "trilm", "parents": "bilm"}]))
    with pytest.raises(ConfigError, match=r"family: a trilm branch of trilm runs converts nothing"):
        load_suite(_suite(tmp_path, prepared, [{"family": "trilm", "parents": "trilm"}]))
    with pytest.raises(ConfigError, match=r"start: 'cooldown', 'end' or a fraction"):
        load_suite(_suite(tmp_path, prepared, [{"family": "trilm", "start": 1.5}]))
    with pytest.raises(ConfigError, match=r"conversions: floatlm-to-trilm named twice"):
        load_suite(_suite(tmp_path, prepared, [{"family": "trilm"}, {"family": "trilm"}]))
    with pytest.raises(ConfigError, match=r"conversion floatlm-pico-to-trilm: unknown key 'convert\.ramps'"):
        conversion_branches(
            load_suite(_suite(tmp_path, prepared, [{"overrides": {"convert": {"ramps": 1}}}]))
        )
    recipe = {"convert": {"ramp": 0.25}, "model": {"quant": {"scale_group": "row"}}}
    suite = load_suite(_suite(tmp_path, prepared, [{"start": 0.5, "name": "half", "overrides": recipe}]))
    assert suite.run("floatlm-pico").cfg.checkpoint.keep_states_at == [10]
    (branch,) = conversion_branches(suite)
    assert branch.run.name == "floatlm-pico-half" and branch.spec.start == 10
    cfg = branch.run.cfg
    assert (
        cfg.convert.ramp == 0.25 and cfg.model.quant.scale_group == "row" and cfg.model.name == "trilm-pico"
    )

    # the plain conversion: the float run to its end (its own cooldown), then a fifth of a longer total
    with pytest.raises(ConfigError, match=r"share: start end needs the conversion's share in \(0, 1\)"):
        load_suite(_suite(tmp_path, prepared, [{"start": "end"}]))
    with pytest.raises(ConfigError, match=r"share: only with start: end"):
        load_suite(_suite(tmp_path, prepared, [{"share": 0.25}]))
    suite = load_suite(_suite(tmp_path, prepared, [{"start": "end", "share": 0.2, "name": "after"}]))
    (branch,) = conversion_branches(suite)
    assert (branch.spec.start, branch.run.cfg.steps, branch.run.tokens) == (20, 25, 25 * 1024)
    assert branch.run.cfg.branch_from.endswith("floatlm-pico/state/step-20")
