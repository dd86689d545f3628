"""Loss-curve tables (``trilm scaling fit --law tissue TABLE``, ``predict --schedule TABLE``) and saved fits
from a user: damaged, truncated, wrong-typed and huge inputs are a :class:`FitError` naming the file (and
the line, for a row), and the command exits 2 without a traceback."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tests.untrusted import SETTINGS, hostile_values, named, truncated_or_flipped
from trilm.cli import main
from trilm.scaling.curves import read_curve, read_schedule
from trilm.scaling.errors import FitError
from trilm.scaling.fitter import Fit

GOOD_CSV = "step,lr,loss\n0,0.0,\n" + "".join(
    f"{s},{4e-3 * min(s / 20, 1):.6g},{5 - s / 400:.6f}\n" for s in range(10, 610, 10)
)
GOOD_JSONL = "".join(
    json.dumps({"step": s, "lr": 1e-3, "loss": 5 - s / 400}) + "\n" for s in range(10, 610, 10)
)


@SETTINGS
@given(data=st.data())
def test_a_damaged_csv_curve_is_a_named_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("curve") / "curve.csv"
    path.write_bytes(truncated_or_flipped(data, GOOD_CSV.encode()))
    curve = named(lambda: read_curve(path), FitError, path, must_fail=False)
    if not isinstance(curve, Exception):
        assert curve.steps.size == curve.loss.size and np.all(np.isfinite(curve.lr))


@SETTINGS
@given(data=st.data())
def test_a_damaged_jsonl_curve_is_a_named_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("curve") / "metrics.jsonl"
    path.write_bytes(truncated_or_flipped(data, GOOD_JSONL.encode()))
    named(lambda: read_curve(path), FitError, path, must_fail=False)
    named(lambda: read_schedule(path), FitError, path, must_fail=False)


@SETTINGS
@given(value=hostile_values(), column=st.sampled_from(["step", "lr", "loss"]), row=st.integers(0, 5))
def test_wrong_typed_and_huge_values_are_named_errors(tmp_path_factory, value, column, row):
    path = tmp_path_factory.mktemp("curve") / "metrics.jsonl"
    records = [{"step": s, "lr": 1e-3, "loss": 5 - s / 400} for s in range(10, 70, 10)]
    records[row][column] = value
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    result = named(lambda: read_curve(path), FitError, path, must_fail=False)
    if isinstance(result, Exception):
        assert "line" in str(result) or "no row" in str(result)


@SETTINGS
@given(value=hostile_values(), key=st.sampled_from(["law", "theta", "boot_thetas", "level", "bootstrap"]))
def test_a_damaged_fit_file_is_a_named_error(tmp_path_factory, value, key):
    path = tmp_path_factory.mktemp("fit") / "fit.json"
    record = {"law": "tissue", "theta": [1.0, 2.0, 0.5, -7.0], "boot_thetas": [], "level": 0.95}
    record[key] = value
    path.write_text(json.dumps(record))
    named(lambda: Fit.load(path), FitError, path, must_fail=False)


def test_the_commands_exit_2_on_a_damaged_table(tmp_path, capsys):
    bad = tmp_path / "curve.csv"
    bad.write_text("step,lr,loss\n1,0.1,3.0\n2,x,2.9\n")
    assert main(["scaling", "fit", "--law", "tissue", "--out", str(tmp_path / "o"), str(bad)]) == 2
    fit = tmp_path / "fit.json"
    fit.write_text("{not json")
    assert main(["scaling", "predict", str(fit), "--schedule", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}, line 3" in err and f"{fit}, line 1" in err and "Traceback" not in err
