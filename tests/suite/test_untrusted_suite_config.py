"""Damaged and hostile suite files: ``load_suite`` answers with a :class:`~trilm.config.ConfigError` naming
the suite file, and ``trilm suite plan`` exits with status 2.

The base is the shipped quickstart suite (``configs/suites/quickstart.yaml``, whose run templates are found
among the installed configs). Loading a suite builds every run's config from its template and the suite's
layers of overrides, so a value at any key of the suite reaches the run-config reader too.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
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
from trilm.suite.config import load_suite

BASE = packaged(Path("configs/suites/quickstart.yaml"))
RAW = BASE.read_bytes()
DATA = yaml.safe_load(RAW)
KEYS = [
    *dotted_keys(DATA),
    *[("families", 0, key) for key in ("name", "config", "batch_tokens", "overrides", "sizes")],
    *[("sizes", 2, key) for key in ("name", "preset", "model", "tensor_parallel", "family_overrides")],
    ("sizes", 2, "family_overrides", "trilm"),
    ("sizes", 2, "family_overrides", "trilm", "optim"),
    ("overrides", "model"),
    ("overrides", "data"),
    ("cooldown",),
]
FEWER = settings(SETTINGS, max_examples=30)
"""Loading a suite builds its twelve run configs (about 0.1 s), so these properties draw fewer examples."""


def test_the_base_suite_loads():
    assert len(load_suite(BASE).runs) == 12


@FEWER
@given(data=st.data())
def test_damaged_bytes_are_read_or_named(tmp_path, data):
    path = tmp_path / "suite.yaml"
    path.write_bytes(truncated_or_flipped(data, RAW))
    named(lambda: load_suite(path), ConfigError, path, must_fail=False)


@FEWER
@given(key=st.sampled_from(KEYS), value=hostile_values())
def test_any_value_at_any_key_is_read_or_named(tmp_path, key, value):
    suite = copy.deepcopy(DATA)
    node = suite
    for part in key[:-1]:  # make the sections on the way (a family's overrides, the cooldown)
        if isinstance(part, str) and not isinstance(node.get(part), dict | list):
            node[part] = {}
        node = node[part]
    node[key[-1]] = value
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    named(lambda: load_suite(path), ConfigError, path, must_fail=False)


HOSTILE_VALUES = {
    "a template path with an unknown field": (("families", 0, "config"), "configs/train/{oops}.yaml"),
    "a template path with an open brace": (("families", 0, "config"), "configs/train/{.yaml"),
    "a template path too long for the file system": (("families", 0, "config"), "a" * 5000),
    "a model section that is a list": (("overrides", "model"), [1, 2]),
    "a data section that is a list": (("overrides", "data"), [1]),
    "a checkpoint section that is a number": (("overrides", "checkpoint"), 5),
    "a family's overrides that are a number": (("sizes", 0, "family_overrides"), {"trilm": 5}),
    "a family's overrides that are a list": (("sizes", 0, "family_overrides"), {"trilm": [1]}),
    "a peak past a float's range": (("hardware", "peak_tflops"), 10**400),
}


@pytest.mark.parametrize(("key", "value"), HOSTILE_VALUES.values(), ids=HOSTILE_VALUES.keys())
def test_hostile_values_are_named(tmp_path, key, value):
    suite = copy.deepcopy(DATA)
    set_path(suite, key, value)
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    named(lambda: load_suite(path), ConfigError, path, must_fail=True)


HOSTILE_FILES = {
    "not utf-8": b"name: q\xff\n",
    "a list": b"- name\n- q\n",
    "nested too deeply": YAML_DEEP.encode(),
    "an integer of 5,000 digits": b"name: q\ntokens: [" + b"9" * 5000 + b"]\n",
    "aliases that would expand to 9**8 items": f"name: {YAML_BOMB}\n".encode(),
}


@pytest.mark.parametrize("raw", HOSTILE_FILES.values(), ids=HOSTILE_FILES.keys())
def test_hostile_suite_files_exit_2_naming_the_file(tmp_path, capsys, raw):
    path = tmp_path / "suite.yaml"
    path.write_bytes(raw)
    named(lambda: load_suite(path), ConfigError, path, must_fail=True)
    assert main(["suite", "plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trilm suite: error: ") and str(path) in err and len(err) < 4000, err
