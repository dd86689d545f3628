"""Damaged results tables (CSV, JSONL, JSON): ``read_table`` answers with a :class:`TableError` naming
the file, whatever the bytes — a cut row, a flipped byte, a huge integer, deep nesting, a NUL — and
``append_rows`` onto a damaged table, or with a row that contradicts one there, refuses without changing a
byte of it (a table it can read keeps every row it held)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.untrusted import SETTINGS, named, truncated_or_flipped
from trilm.scaling.table import ResultRow, TableError, append_rows, read_table, write_table

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
        ("field.csv", (",".join([*ROW, "step"]) + "\n" + "1" * 200_000 + ",r" * 11 + "\n").encode()),
        ("digits.jsonl", b'{"params": ' + b"9" * 400 + b"}\n"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_hostile_tables_are_named(tmp_path, name, raw):
    path = tmp_path / name
    path.write_bytes(raw)
    named(lambda: read_table(path), TableError, path, must_fail=True)


NEW = ResultRow(**ROW | {"run": "new"}, step=40)


@SETTINGS
@given(data=st.data())
def test_appending_to_a_damaged_table_loses_nothing(table, tmp_path, data):
    suffix, raw = table
    path = tmp_path / f"results.{suffix}"
    path.write_bytes(truncated_or_flipped(data, raw))
    before = path.read_bytes()
    try:
        held = read_table(path)
    except TableError:
        held = None
    if held is None:
        named(lambda: append_rows(path, [NEW]), TableError, path, must_fail=True)
        assert path.read_bytes() == before, "a refused append changed the table"
        return
    append_rows(path, [NEW])
    after = {row.key: row for row in read_table(path)}
    assert all(after[row.key].same_values(row) for row in held), "an append lost or changed a row"
    assert NEW.key in after


@pytest.mark.parametrize("suffix", ["csv", "jsonl", "json"])
def test_a_contradicting_row_is_refused_and_the_table_kept(tmp_path, suffix):
    path = tmp_path / f"results.{suffix}"
    write_table(path, [ResultRow(**ROW, step=s) for s in (10, 20)])
    before = path.read_bytes()
    clash = ResultRow(**ROW | {"loss": 9.0}, step=20)
    named(lambda: append_rows(path, [NEW, clash]), TableError, path, must_fail=True)
    assert path.read_bytes() == before
