"""Fixtures of the suite tests: the embedded corpus prepared once and a tiny two-size, two-family suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from trilm.data.pipeline import prepare_embedded
from trilm.testing.cluster.runs import write_suite

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def prepared(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("suite-data")
    return prepare_embedded(out, vocab_size=512, workers=1, progress=False)


@pytest.fixture(scope="session")
def trained(tmp_path_factory, prepared) -> Path:
    """The toy suite (TriLM and FloatLM × pico and nano, 8 steps each) trained once; tests copy it."""
    from trilm.suite import load_suite
    from trilm.suite.launch import launch_local

    directory = tmp_path_factory.mktemp("trained-suite")
    suite = load_suite(write_suite(directory, prepared))
    outcomes = launch_local(suite, suite.runs, progress=False, echo=lambda _: None)
    assert [o.action for o in outcomes] == ["trained"] * 4, outcomes
    return directory


def copy_suite(trained: Path, prepared: dict[str, Path], directory: Path):
    """A private copy of the trained toy suite (same definition, runs copied under ``directory``)."""
    import shutil

    from trilm.suite import load_suite

    shutil.copytree(trained / "runs", directory / "runs")
    return load_suite(write_suite(directory, prepared))
