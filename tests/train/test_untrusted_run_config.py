"""Damaged and hostile run configs: ``TrainConfig.from_yaml`` (and its ``key=value`` overrides) answers with a
:class:`~trilm.config.ConfigError` naming the file or the override, and ``trilm train`` exits with status 2.

The base is a shipped run config (``configs/train/quickstart-trilm.yaml``). The properties damage its bytes
(cut anywhere, bits flipped), put any YAML value at any key (the wrong type, an absurd number, a mapping
where a number goes, an unknown key), and apply overrides built from its keys and any text.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from trilm.configs import packaged

from tests.untrusted import (
    SETTINGS,
    YAML_BOMB,
    YAML_DEEP,
    dotted_keys,
    hostile_values,
    named,
    set_path,
    truncated_or_flipped,
)
from trilm.cli import main
from trilm.config import ConfigError
from trilm.train.config import TrainConfig

BASE = packaged(Path("configs/train/quickstart-trilm.yaml"))
RAW = BASE.read_bytes()
DATA = yaml.safe_load(RAW)
KEYS = [*dotted_keys(DATA), ("init_from",), ("model", "quant"), ("distill", "teacher"), ("parallel",)]


def test_the_base_config_parses():
    assert TrainConfig.from_yaml(BASE).model.family == "trilm"


@SETTINGS
@given(data=st.data())
def test_damaged_bytes_are_read_or_named(tmp_path, data):
    path = tmp_path / "run.yaml"
    path.write_bytes(truncated_or_flipped(data, RAW))
    named(lambda: TrainConfig.from_yaml(path), ConfigError, path, must_fail=False)


@SETTINGS
@given(key=st.sampled_from(KEYS), value=hostile_values(), extra=st.booleans())
def test_any_value_at_any_key_is_read_or_named(tmp_path, key, value, extra):
    config = copy.deepcopy(DATA)
    if extra:  # an unknown key beside the known ones
        key = (*key[:-1], f"{key[-1]}_")
    if len(key) > 1 and not isinstance(config.get(key[0]), dict):
        config[key[0]] = {}
    set_path(config, key, value)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    error = named(lambda: TrainConfig.from_yaml(path), ConfigError, path, must_fail=extra)
    if extra:
        assert ".".join(key) in str(error), f"the error does not name the unknown key: {error}"


@SETTINGS
@given(
    key=st.sampled_from([".".join(k) for k in KEYS]) | st.text(max_size=12),
    value=st.text(max_size=20) | st.sampled_from(["[", "{a: ", "9" * 5000, "9" * 400, YAML_DEEP, "*a"]),
)
def test_any_override_is_applied_or_named(key, value):
    base = TrainConfig.from_yaml(BASE)
    item = f"{key}={value}"
    try:
        base.with_overrides([item])
    except ConfigError as exc:
        assert str(exc).strip(), "an empty error message"


HOSTILE = {
    "not utf-8": b"seed: 1\nrun_dir: \xff\xfe\n",
    "a list": b"- seed\n- 1\n",
    "nested too deeply": YAML_DEEP.encode(),
    "an integer of 5,000 digits": b"tokens: " + b"9" * 5000 + b"\n",
    "a float past its range": b"optim: {lr: " + b"9" * 400 + b"}\n",
    "a preset that is a number": b"model: {preset: 5}\n",
    "a quant section that is a list": b"model: {preset: trilm-tiny, quant: [1]}\n",
    "aliases that would expand to 9**8 items": f"seed: {YAML_BOMB}\n".encode(),
    "a python tag": b"seed: !!python/object/apply:os.system [ls]\n",
    "a NUL byte": b"seed: 1\x00\n",
}


@pytest.mark.parametrize("raw", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_run_configs_exit_2_naming_the_file(tmp_path, capsys, raw):
    path = tmp_path / "run.yaml"
    path.write_bytes(raw)
    named(lambda: TrainConfig.from_yaml(path), ConfigError, path, must_fail=True)
    assert main(["train", "--config", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trilm train: error: ") and str(path) in err and len(err) < 4000, err


@pytest.mark.parametrize("override", ["tokens=[", "seed=" + "9" * 5000, "optim.lr=" + "9" * 400, "seed"])
def test_a_bad_override_exits_2_naming_it(tmp_path, capsys, override):
    assert main(["train", "--config", str(BASE), override, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trilm train: error: ") and override.split("=")[0] in err, err
