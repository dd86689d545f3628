"""Suite definitions: the shipped suites expand to the runs they promise, and bad definitions are refused
with a message naming the file, the run and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.suite.conftest import REPO, write_suite
from trilm.config import ConfigError
from trilm.model.config import SPECTRA_SIZES
from trilm.suite import load_suite
from trilm.train.config import TrainConfig

SPECTRA_MP = [1, 1, 1, 1, 1, 2, 2, 3, 6]


def test_spectra_suite_runs():
    suite = load_suite("spectra")
    assert [r.name for r in suite.runs] == [f"{f}-{s}" for f in ("trilm", "floatlm") for s in SPECTRA_SIZES]
    for family in ("trilm", "floatlm"):
        runs = [r for r in suite.runs if r.family == family]
        assert [r.tensor_parallel for r in runs] == SPECTRA_MP
        assert {r.cfg.batch_tokens for r in runs} == {1_048_576 if family == "trilm" else 2_097_152}
    for run in suite.runs:
        assert run.tokens == 300_000_000_000 and run.cfg.sequence_length == 2048
        assert run.cfg.model.name == run.name and run.cfg.run_dir == f"runs/spectra/{run.name}"
        assert run.devices == run.tensor_parallel * 8


def test_spectra_bilm_is_optional_and_matches_its_run_configs():
    suite = load_suite("spectra", families=["trilm", "floatlm", "bilm"])
    bilm = [r for r in suite.runs if r.family == "bilm"]
    assert [r.size for r in bilm] == ["99m", "190m", "390m", "560m", "830m", "1.1b"]
    for run in suite.runs:
        # the suite trains exactly what `trilm train --config configs/train/<run>.yaml` trains
        shipped = TrainConfig.from_yaml(REPO / f"configs/train/{run.name}.yaml")
        shipped = shipped.replace(run_dir=run.cfg.run_dir, seq_len=shipped.sequence_length)
        assert run.cfg.to_dict() == shipped.to_dict(), run.name


@pytest.mark.parametrize("name", ["quickstart", "minisuite", "ladder"])
def test_cpu_suites(name):
    suite = load_suite(name)
    families = {r.family for r in suite.runs}
    assert families == {"trilm", "floatlm", "bilm"}
    sizes = {f: [r.size for r in suite.runs if r.family == f] for f in families}
    assert len({tuple(v) for v in sizes.values()}) == 1
    assert len(sizes["trilm"]) >= (4 if name == "minisuite" else 3)
    assert len({r.cfg.steps * r.cfg.batch_tokens for r in suite.runs}) == 1  # one token budget
    params = [r.cfg.model.hidden for r in suite.runs if r.family == "trilm"]
    assert params == sorted(params) and len(set(params)) == len(params)
    assert all(r.cfg.data.train_dir == f"runs/{name}/data/train" for r in suite.runs)


def _definition(tmp_path: Path, prepared: dict, **changes) -> Path:
    path = write_suite(tmp_path, prepared)
    data = yaml.safe_load(path.read_text())
    for key, value in changes.items():
        node = data
        *parents, last = key.split(".")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[last] = value
    path.write_text(yaml.safe_dump(data))
    return path


FAKE_DATA = {k: Path(f"/nonexistent/{k}") for k in ("train", "validation", "tokenizer")}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"famlies": []}, "unknown key 'famlies' (did you mean 'families'?)"),
        ({"families.0.name": "ternary"}, "families[0].name: 'ternary' is not one of"),
        ({"families.0.sizes": ["huge"]}, "families[0].sizes: ['huge'] are not among the suite's sizes"),
        ({"families.1.config": "configs/train/nope-{size}.yaml"}, "template 'configs/train/nope-pico.yaml'"),
        ({"sizes.1.tensor_parallel": 3}, "run trilm-nano (template"),
        ({"overrides.micro_batch": 5}, "run trilm-pico: batch_tokens: 16 sequences per step"),
        ({"checkpoint.snapshot_evry": 4}, "unknown key 'checkpoint.snapshot_evry'"),
        ({"tokens": [8192, 8192]}, "tokens: repeated budget"),
        (
            {"analysis": {"x": "embedding"}},
            "analysis.x: 'embedding' is not one of params, nonembedding_params",
        ),
        (
            {"hardware.device": "TPU9", "hardware.peak_tflops": 0},
            "hardware.peak_tflops: device 'TPU9' is not in the peak table",
        ),
    ],
)
def test_bad_definitions_name_file_run_and_key(tmp_path, changes, message):
    path = _definition(tmp_path, FAKE_DATA, **changes)
    with pytest.raises(ConfigError) as info:
        load_suite(path)
    assert str(info.value).startswith(str(path)) and message in str(info.value), str(info.value)


def test_unknown_suite_and_family():
    with pytest.raises(ConfigError, match="unknown suite 'nosuch'.*minisuite"):
        load_suite("nosuch")
    with pytest.raises(ConfigError, match=r"families \['quantlm'\] are not in suite spectra"):
        load_suite("spectra", families=["quantlm"])


def test_token_budgets_make_separate_runs(tmp_path):
    path = _definition(tmp_path, FAKE_DATA, tokens=[4096, 16384])
    suite = load_suite(path, root=tmp_path / "elsewhere")
    assert [r.name for r in suite.runs][:2] == ["trilm-pico-4p1k", "trilm-pico-16p4k"]
    assert {r.cfg.steps for r in suite.runs} == {4, 16}
    assert all(Path(r.cfg.run_dir).parent == tmp_path / "elsewhere" for r in suite.runs)


def test_size_overrides_come_after_the_family_and_the_suite(tmp_path):
    """A size's own run-config keys (a per-size learning rate, as Spectra tuned) win over the family's."""
    path = _definition(
        tmp_path,
        FAKE_DATA,
        **{"families.0.overrides": {"optim": {"lr": 3e-3}}, "sizes.0.overrides": {"optim": {"lr": 1e-3}}},
    )
    runs = {r.name: r.cfg for r in load_suite(path).runs}
    assert runs["trilm-pico"].optim.lr == 1e-3
    assert runs["trilm-nano"].optim.lr == 3e-3
    assert runs["floatlm-pico"].optim.lr == 1e-3
    (tmp_path / "bad").mkdir()
    bad = _definition(tmp_path / "bad", FAKE_DATA, **{"sizes.0.overrides": {"optim": {"lrr": 1e-3}}})
    with pytest.raises(ConfigError, match="lrr"):
        load_suite(bad)


def test_family_overrides_of_a_size_come_last(tmp_path):
    """A learning rate tuned per (family, size): the size's family_overrides win over everything else."""
    path = _definition(
        tmp_path,
        FAKE_DATA,
        **{
            "sizes.0.overrides": {"optim": {"lr": 1e-3}},
            "sizes.0.family_overrides": {"trilm": {"optim": {"lr": 4e-3}}},
        },
    )
    runs = {r.name: r.cfg for r in load_suite(path).runs}
    assert (runs["trilm-pico"].optim.lr, runs["floatlm-pico"].optim.lr) == (4e-3, 1e-3)
    (tmp_path / "bad").mkdir()
    bad = _definition(tmp_path / "bad", FAKE_DATA, **{"sizes.0.family_overrides": {"ternary": {}}})
    with pytest.raises(ConfigError, match=r"sizes\[0\].family_overrides: \['ternary'\] are not families"):
        load_suite(bad)


def test_the_mup_check_trains_the_ladders_recipe():
    """configs/suites/ladder-mup.yaml trains FloatLM as the ladder does (shapes where they share a size, data,
    budget, batch, schedule, checkpoints; the rate is what both sweep), so their runs compare."""
    ladder = {r.size: r.cfg for r in load_suite("ladder", families=["floatlm"]).runs}
    mup = {r.size: r.cfg for r in load_suite("ladder-mup").runs}

    def recipe(cfg):
        data = cfg.to_dict()
        for key in ("train_dir", "valid_dir", "tokenizer"):
            data["data"].pop(key)
        data.pop("run_dir")
        data["optim"].pop("lr")
        return data

    for size in ("128x4", "192x4"):
        assert recipe(ladder[size]) == recipe(mup[size]), size
    assert mup["64x4"].model.layers == 4 and mup["64x4"].model.hidden == 64
