"""Damaged results tables (CSV, JSONL, JSON): ``read_table`` answers with a :class:`TableError` naming
the file, whatever the bytes — a cut row, a flipped byte, a huge integer, deep nesting, a NUL."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.untrusted import SETTINGS, named, truncated_or_flipped
from trilm.scaling.table import ResultRow, TableError, read_table, write_table

ROW = dict(run="r", family="floatlm", size="nano", params=100, nonembedding_params=80, linear_params=60)
ROW |= dict(tokens=1e6, flops=6e8, bits_per_param=16.0, eval="val", loss=3.5)


@pytest.fixture(scope="module", params=["csv", "jsonl", "json"])
def table(request, tmp_path_factory) -> tuple[str, bytes]:
    path = tmp_path_factory.mktemp("table") / f"results.{request.param}"
    write_table(path, [ResultRow(**ROW, step=s) for s in (10, 20, 30)])
    return request.param, path.read_bytes()


@SETTINGS
@given(data=st.data())
def test_a_damaged_table_is_read_or_named(table, tmp_path, data):
    suffix, raw = table
    damaged = truncated_or_flipped(data, raw)
    path = tmp_path / f"results.{suffix}"
    path.write_bytes(damaged)
    named(lambda: read_table(path), TableError, path, must_fail=False)


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("deep.json", b"[" * 100000),
        ("huge.jsonl", b'{"params": ' + b"9" * 5000 + b"}\n"),
        ("nul.csv", b"run,family\x00\n"),
        ("wide.csv", b"run\n" + b"x" * 200000 + b"\n"),
        ("rows.json", b'{"rows": {"a": 1}}'),
    ],
)
def test_hostile_tables_are_named(tmp_path, name, raw):
    path = tmp_path / name
    path.write_bytes(raw)
    named(lambda: read_table(path), TableError, path, must_fail=True)
