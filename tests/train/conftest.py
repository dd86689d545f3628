"""Fixtures of the training tests: the embedded corpus prepared once, and a tiny run config on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from trilm.data.pipeline import prepare_embedded
from trilm.testing.cluster.runs import (  # noqa: F401 - the tests' names for the shared runs
    LAUNCH_TIMEOUT,
    MULTINODE_STEPS,
    SUITE_STEPS,
    multinode_config,
    slurm_suite,
    tiny_config,
)


@pytest.fixture(scope="session")
def prepared(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("train-data")
    return prepare_embedded(out, vocab_size=512, workers=1, progress=False)


def _launch_to_end(tmp_path_factory, prepared, name: str, launcher_factory) -> Path:
    from trilm.testing.cluster.drills import run_to_end
    from trilm.testing.cluster.processes import ProcessSet

    root = tmp_path_factory.mktemp(name)
    config = multinode_config(prepared, root / "run")
    with ProcessSet(root / "logs") as processes:
        outcome = run_to_end(processes, launcher_factory(), config, name, LAUNCH_TIMEOUT)
    assert outcome.codes == [0] * len(outcome.codes), outcome.tail()
    return root / "run"


@pytest.fixture(scope="session")
def one_node_run(tmp_path_factory, prepared) -> Path:
    """The reference: 1 node × 4 processes (torchrun), TP 2 × DP 2; its run directory."""
    from trilm.testing.cluster.launchers import Torchrun

    return _launch_to_end(tmp_path_factory, prepared, "one-node", lambda: Torchrun(1, 4))


@pytest.fixture(scope="session")
def two_node_run(tmp_path_factory, prepared) -> Path:
    """The same run on 2 loopback nodes × 2 processes (torchrun, TP inside a node); its run directory."""
    from trilm.testing.cluster.launchers import Torchrun

    return _launch_to_end(tmp_path_factory, prepared, "two-nodes", lambda: Torchrun(2, 2))
