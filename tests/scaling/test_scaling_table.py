"""The results table: round trips, appending without duplicates, errors naming file, line and column."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from trilm.scaling.table import (
    COLUMNS,
    TERNARY_BITS,
    ResultRow,
    TableError,
    append_rows,
    default_linear_bits,
    model_bits,
    quantized_linear_bits,
    read_table,
    write_table,
)


def _row(**changes):
    base = ResultRow.from_counts(
        run="trilm-99M",
        family="trilm",
        size="99M",
        params=99_740_000,
        nonembedding_params=48_240_000,
        linear_params=48_200_000,
        tokens=3.0e11,
        flops=1.8e20,
        step=278_000,
        eval="val_loss",
        loss=2.61,
    )
    return dataclasses.replace(base, **changes)


def test_bits_helpers():
    assert abs(TERNARY_BITS - 1.58496) < 1e-5
    assert model_bits(100, 50, 1.58) == pytest.approx(158 + 800)
    assert quantized_linear_bits(4, group_size=128) == pytest.approx(4.125)
    assert quantized_linear_bits(3, group_size=64, zero_bits=3) == pytest.approx(3 + 19 / 64)
    assert default_linear_bits("floatlm") == 16 and default_linear_bits("BiLM") == 1
    assert default_linear_bits("quantlm-gptq-3") == pytest.approx(3 + 19 / 128)  # GPTQ: scale + 3-bit zero
    assert default_linear_bits("my-experiment") is None
    row = _row()
    expected = (TERNARY_BITS * 48_200_000 + 16 * (99_740_000 - 48_200_000)) / 99_740_000
    assert row.bits_per_param == pytest.approx(expected)
    assert row.model_bits == pytest.approx(expected * 99_740_000)


@pytest.mark.parametrize("suffix", [".csv", ".json", ".jsonl"])
def test_round_trip_keeps_values_and_extra_columns(tmp_path, suffix):
    rows = [_row(), _row(step=1000, tokens=1.08e9, loss=5.5, extra={"seed": "1"})]
    path = write_table(tmp_path / f"results{suffix}", rows)
    back = read_table(path)
    assert back == [dataclasses.replace(rows[0], extra={"seed": ""}), rows[1]]


def test_append_skips_rows_present_and_refuses_conflicts(tmp_path):
    path = tmp_path / "results.csv"
    assert append_rows(path, [_row()]) == (1, 0)
    assert append_rows(path, [_row(), _row(step=1000, loss=5.0)]) == (1, 1)
    assert [r.step for r in read_table(path)] == [278_000, 1000]
    before = path.read_text()
    with pytest.raises(
        TableError, match=r"step 278000 eval 'val_loss' is already present with different values"
    ):
        append_rows(path, [_row(step=5, loss=6.0), _row(loss=2.7)])
    assert path.read_text() == before  # nothing written, nothing lost
    assert append_rows(path, [_row(loss=2.7)], replace=True) == (1, 0)
    assert read_table(path)[0].loss == 2.7


def _write_csv(path, records):
    header = list(COLUMNS)
    lines = [",".join(header)] + [",".join(str(r.get(c, "")) for c in header) for r in records]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("loss", "nan", r"line 3, column 'loss': 'nan' is not a finite number"),
        ("loss", "-1", r"line 3, column 'loss': -1.0 must be > 0"),
        ("params", "abc", r"line 3, column 'params': 'abc' is not a number"),
        ("params", "0", r"line 3, column 'params': 0 must be > 0"),
        ("tokens", "-5", r"line 3, column 'tokens': -5.0 must be ≥ 0"),
        ("step", "1.5", r"line 3, column 'step': '1.5' is not an integer"),
        ("family", "", r"line 3, column 'family': must not be empty"),
        ("bits_per_param", "", r"line 3, column 'bits_per_param': missing value"),
        (
            "nonembedding_params",
            "200000000",
            r"line 3, column 'nonembedding_params': 200000000 must be in \(0, params\]",
        ),
    ],
)
def test_bad_values_name_file_line_and_column(tmp_path, column, value, message):
    good = _row().to_record()
    bad = {**good, "step": 5, column: value}
    path = tmp_path / "results.csv"
    _write_csv(path, [good, bad])
    with pytest.raises(TableError, match=rf"results\.csv {message}"):
        read_table(path)


def test_missing_column_and_bad_json_are_named(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text("run,family\nx,trilm\n")
    with pytest.raises(TableError, match=r"results\.csv: header lacks columns size, params"):
        read_table(path)
    jpath = tmp_path / "results.json"
    record = _row().to_record()
    del record["loss"]
    jpath.write_text(json.dumps({"rows": [_row().to_record(), record]}))
    with pytest.raises(TableError, match=r"results\.json row 1: missing column loss"):
        read_table(jpath)
    jpath.write_text('{"rows": [1, 2')
    with pytest.raises(TableError, match=r"results\.json line 1: invalid JSON"):
        read_table(jpath)
    with pytest.raises(TableError, match=r"nope\.csv: no such results table"):
        read_table(tmp_path / "nope.csv")
    with pytest.raises(TableError, match=r"unknown table format '\.txt'"):
        write_table(tmp_path / "x.txt", [])


def test_conflicting_duplicates_across_files_are_an_error(tmp_path):
    a = write_table(tmp_path / "a.csv", [_row()])
    b = write_table(tmp_path / "b.json", [_row()])
    assert len(read_table(a, b)) == 1
    write_table(b, [_row(loss=3.0)])
    with pytest.raises(
        TableError, match=r"b\.json row 0: run 'trilm-99M' step 278000.*already in .*a\.csv line 2"
    ):
        read_table(a, b)


def test_non_finite_values_in_json_are_rejected(tmp_path):
    record = {**_row().to_record(), "flops": math.inf}
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(TableError, match=r"r\.jsonl line 1, column 'flops': inf is not a finite number"):
        read_table(path)


def test_non_utf8_table_is_a_clear_error_and_fit_names_it(tmp_path, capsys):
    path = tmp_path / "results.csv"
    write_table(path, [_row()])
    latin1 = path.read_text().replace(_row().run, "caf\xe9").encode("latin-1")
    path.write_bytes(latin1)
    with pytest.raises(TableError, match=r"results\.csv line 2: not UTF-8 text \(byte 0xe9"):
        read_table(path)
    from trilm.cli import main

    assert main(["scaling", "fit", str(path), "--no-plots", "--bootstrap", "0"]) == 2
    err = capsys.readouterr().err
    assert "line 2: not UTF-8" in err and "Traceback" not in err
    out_file = tmp_path / "taken"
    out_file.write_text("")
    write_table(path, [_row()])
    assert main(["scaling", "fit", str(path), "--out", str(out_file)]) == 2
    assert "is an existing file, not a directory" in capsys.readouterr().err
