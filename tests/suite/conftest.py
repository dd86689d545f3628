"""Fixtures of the suite tests: the embedded corpus prepared once and a tiny two-size, two-family suite."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trilm.data.pipeline import prepare_embedded

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def prepared(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("suite-data")
    return prepare_embedded(out, vocab_size=512, workers=1, progress=False)


def write_suite(
    directory: Path,
    prepared: dict[str, Path],
    *,
    name: str = "toy",
    families: tuple[str, ...] = ("trilm", "floatlm"),
    steps: int = 8,
    **extra,
) -> Path:
    """A suite of 1-2 layer models on 64-token sequences: a few seconds per run on one CPU core."""
    data = {
        "name": name,
        "root": str(directory / "runs"),
        "families": [
            {"name": f, "config": str(REPO / f"configs/train/quickstart-{f}.yaml")} for f in families
        ],
        "sizes": [
            {"name": "pico", "preset": "nano", "model": {"hidden": 32, "ffn": 96, "heads": 2, "layers": 1}},
            {"name": "nano"},
        ],
        "tokens": [1024 * steps],
        "seq_len": 64,
        "checkpoint": {"snapshot_every": 4, "log_spaced_until": 2, "state_every": 4, "keep_last": 2},
        "overrides": {
            "model": {"vocab_size": 512},
            "batch_tokens": 1024,
            "micro_batch": 16,
            "data": {"valid_sequences": 16},
            "schedule": {"warmup": 1},
            "log": {"every": 2, "tensorboard": False, "progress": False},
        },
        "data": {k: str(prepared[v]) for k, v in (("train_dir", "train"), ("valid_dir", "validation"))}
        | {"tokenizer": str(prepared["tokenizer"])},
        "hardware": {"device": "cpu", "peak_tflops": 0.2, "mfu": 0.25, "devices_per_node": 1},
    }
    data.update(extra)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


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
