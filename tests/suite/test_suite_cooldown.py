"""``trilm suite cooldown``: branches of a toy WSD suite, their parents' kept states, status and analysis."""

from __future__ import annotations

import pytest

from tests.suite.conftest import write_suite
from trilm.cli import main
from trilm.config import ConfigError
from trilm.scaling import read_table
from trilm.suite import load_suite
from trilm.suite.cooldown import branch_state, cooldown_branches
from trilm.suite.launch import launch_local

WSD = {
    "schedule": {
        "kind": "wsd",
        "warmup": 2,
        "cooldown": 0.2,
        "lr_drop_at": None,
        "weight_decay_off_at": None,
    },
    "optim": {"min_lr_ratio": 0.0},
}


def _suite(tmp_path, prepared, **extra):
    base = {
        "model": {"vocab_size": 512},
        "batch_tokens": 1024,
        "micro_batch": 16,
        "data": {"valid_sequences": 16},
        "log": {"every": 2, "tensorboard": False, "progress": False},
        **WSD,
    }
    return write_suite(
        tmp_path,
        prepared,
        families=("floatlm",),
        steps=20,
        overrides=base,
        cooldown={"at": [0.5, 1.0], "fraction": 0.2},
        **extra,
    )


def test_cooldown_branches_of_a_wsd_suite(tmp_path, prepared, capsys):
    path = _suite(tmp_path, prepared)
    suite = load_suite(path)
    assert [r.cfg.checkpoint.keep_states_at for r in suite.runs] == [[8], [8]]
    branches = cooldown_branches(suite)
    assert [(b.run.name, b.spec.start, b.spec.steps, b.itself) for b in branches] == [
        ("floatlm-pico-cd10p2k", 8, 10, False),
        ("floatlm-pico-cd20p5k", 16, 20, True),
        ("floatlm-nano-cd10p2k", 8, 10, False),
        ("floatlm-nano-cd20p5k", 16, 20, True),
    ]
    assert branch_state(branches[0])[0] == "waiting"

    launch_local(suite, suite.runs, progress=False)
    assert main(["suite", "cooldown", str(path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "floatlm-pico-cd20p5k" in out and "is its parent" in out
    assert all(branch_state(b)[0] in ("finished", "parent") for b in branches)
    parent_files = sorted(p.name for p in (suite.runs[0].run_dir / "state").iterdir())
    assert parent_files == ["step-16", "step-20", "step-8"]  # keep_last 2, and the branch point

    assert main(["suite", "cooldown", str(path), "--no-progress"]) == 0
    assert "skipped" in capsys.readouterr().out
    assert main(["suite", "status", str(path)]) == 0
    status = capsys.readouterr().out
    assert "cooldown branches: 4 (2 finished, 2 parent)" in status

    assert main(["suite", "analyse", str(path), "--bootstrap", "0", "--no-plots"]) == 0
    rows = read_table(suite.root / "results.csv")
    branch_rows = [r for r in rows if r.run == "floatlm-pico-cd10p2k"]
    assert branch_rows and {r.extra["parent"] for r in branch_rows} == {"floatlm-pico"}
    assert branch_rows[-1].tokens == 10 * 1024 and branch_rows[-1].step == 10
    assert all(r.extra.get("parent", "") == "" for r in rows if r.run == "floatlm-pico")


def test_cooldown_needs_wsd_parents_and_room(tmp_path, prepared):
    decay = write_suite(tmp_path, prepared, families=("floatlm",), cooldown={"at": [0.5]})
    with pytest.raises(ConfigError, match="run floatlm-pico: cooldown.at asks for cooldown branches"):
        load_suite(decay)
    (tmp_path / "late").mkdir()
    late = _suite(tmp_path / "late", prepared)
    suite = load_suite(late)
    with pytest.raises(ConfigError, match="outside the parent's stable phase"):
        cooldown_branches(suite, at=[1.0], fraction=0.1)
