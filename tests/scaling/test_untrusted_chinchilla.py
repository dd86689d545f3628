"""A damaged Chinchilla CSV (Epoch AI's data, or a user's own): ``load_chinchilla`` reads it or answers with a
:class:`TableError` naming the file — never csv's, codecs' or numpy's own exception."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.untrusted import SETTINGS, named, truncated_or_flipped
from trilm.scaling.chinchilla import default_csv_path, load_chinchilla
from trilm.scaling.table import TableError

RAW = default_csv_path().read_bytes()[:4000]
"""The shipped CSV's header and first rows: every section a damage can hit, at a size Hypothesis can walk."""


@SETTINGS
@given(data=st.data())
def test_a_damaged_chinchilla_csv_is_read_or_named(tmp_path, data):
    raw = RAW[: RAW.rindex(b"\n") + 1]
    damaged = truncated_or_flipped(data, raw)
    path = tmp_path / "chinchilla.csv"
    path.write_bytes(damaged)
    named(lambda: load_chinchilla(path, drop_highest=0), TableError, path, must_fail=False)


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("nul.csv", b"Model Size,Training FLOP,loss\n1e6,\x001e18,3.0\n"),
        ("latin1.csv", b"Model Size,Training FLOP,loss\n1e6,1e18,3.0\xff\n"),
        ("wide.csv", b"Model Size,Training FLOP,loss\n" + b"1" * 200000 + b",1e18,3.0\n"),
        ("empty.csv", b""),
        ("header-only.csv", b"Model Size,Training FLOP,loss\n"),
        ("negative.csv", b"Model Size,Training FLOP,loss\n-1e6,1e18,3.0\n"),
        ("too-few.csv", b"Model Size,Training FLOP,loss\n1e6,1e18,3.0\n"),
    ],
)
def test_hostile_chinchilla_csvs_are_named(tmp_path, name, raw):
    path = tmp_path / name
    path.write_bytes(raw)
    named(lambda: load_chinchilla(path), TableError, path, must_fail=True)
