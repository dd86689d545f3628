"""Cooldown branches: a run started from another run's state (``branch_from``) is exactly the run trained to
that length from scratch, and the parent is only read."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from trilm.config import ConfigError
from trilm.parallel import shutdown_parallel
from trilm.store.integrity import complete_steps
from trilm.train.trainer import Trainer

from .conftest import tiny_config

WSD = {"schedule.kind": "wsd", "schedule.warmup": 2, "schedule.cooldown": 0.25, "optim.min_lr_ratio": 0.0}


def _fit(cfg):
    try:
        return Trainer(cfg).fit()
    finally:
        shutdown_parallel()


def _weights(run_dir, step):
    return load_file(str(run_dir / "snapshots" / f"step-{step}" / "model.safetensors"))


def _tree(root):
    files = [p for p in root.rglob("*") if p.is_file()]
    return {p.relative_to(root): (p.stat().st_size, p.stat().st_mtime_ns) for p in files}


@pytest.fixture(scope="module")
def parent(prepared, tmp_path_factory):
    """A 32-step WSD TriLM run that keeps its state at step 9, the start of a 12-step branch's cooldown."""
    root = tmp_path_factory.mktemp("branch-parent") / "parent"
    _fit(tiny_config(prepared, root, tokens=1024 * 32, **WSD, **{"checkpoint.keep_states_at": "[9]"}))
    return root


def test_branch_equals_the_run_trained_to_its_length(prepared, tmp_path, parent):
    family = "trilm"
    assert [s for s, _ in complete_steps(parent / "state")] == [9, 28, 32]
    before = _tree(parent)

    fresh = tiny_config(prepared, tmp_path / "fresh", family, tokens=1024 * 12, **WSD)
    fresh_val = _fit(fresh).val_losses[12]
    branch_cfg = tiny_config(
        prepared,
        tmp_path / "branch",
        family,
        tokens=1024 * 12,
        **WSD,
        branch_from=str(parent / "state" / "step-9"),
    )
    summary = _fit(branch_cfg)
    assert summary.resumed_from == 9
    a, b = _weights(tmp_path / "fresh", 12), _weights(tmp_path / "branch", 12)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert summary.val_losses[12] == fresh_val
    assert _tree(parent) == before, "the branch changed its parent's directory"
    events = (tmp_path / "branch" / "logs" / "events.jsonl").read_text()
    assert '"branch"' in events and "step-9" in events
    meta = (tmp_path / "branch" / "snapshots" / "step-12" / "config.json").read_text()
    assert f'"parent": "{parent.name}"' in meta and '"step": 9' in meta

    # rerunning the finished branch changes nothing and does not go back to the parent
    _fit(branch_cfg)
    assert torch.equal(_weights(tmp_path / "branch", 12)[next(iter(a))], b[next(iter(a))])


def test_branch_is_refused_where_it_would_not_be_exact(prepared, tmp_path, parent):
    state = str(parent / "state" / "step-9")
    # the warm-up as a fraction of the run moves with the run's length: the rate before step 9 differs
    moved = tiny_config(
        prepared, tmp_path / "b1", tokens=1024 * 12, **{**WSD, "schedule.warmup": 0.25}, branch_from=state
    )
    with pytest.raises(ConfigError, match="schedule differs from this run's at step 0"):
        _fit(moved)
    other = tiny_config(prepared, tmp_path / "b2", tokens=1024 * 12, **WSD, branch_from=state, seed=7)
    with pytest.raises(ConfigError, match="differs from this run in seed"):
        _fit(other)
    late = tiny_config(prepared, tmp_path / "b3", tokens=1024 * 8, **WSD, branch_from=state)
    with pytest.raises(ConfigError, match="state is at step 9; a branch of 8 steps"):
        _fit(late)
    missing = tiny_config(
        prepared, tmp_path / "b4", tokens=1024 * 12, **WSD, branch_from=str(parent / "state/step-5")
    )
    with pytest.raises(ConfigError, match="not a complete training state"):
        _fit(missing)
