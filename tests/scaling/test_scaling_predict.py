"""``trilm scaling fit --law`` and ``trilm scaling predict`` on tables made by hand: a loss curve written as
CSV is fitted and predicted along a longer schedule; results tables give size laws; malformed tables and
fits are refused with the file, line and column."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trilm.cli import main
from trilm.scaling.curves import LossCurve, read_curve
from trilm.scaling.fitter import Fit
from trilm.scaling.laws import LAWS, get_law

TRUTH = {"L0": 2.5, "A": 6.0, "alpha": 0.5, "C": 1e-3}
STEPS = 600


def _rates(steps: int, cooldown_from: int) -> np.ndarray:
    lr = np.minimum(np.arange(1, steps + 1) / 20, 1.0)
    lr[cooldown_from:] = np.linspace(1.0, 0.02, steps - cooldown_from)
    return 4e-3 * lr


def _truth(lr: np.ndarray, steps: np.ndarray) -> np.ndarray:
    law = get_law("tissue")
    return np.exp(
        law.log_predict(law.theta(TRUTH), law.design([LossCurve("t", lr, steps, steps * 0 + 1.0)]))[0]
    )


@pytest.fixture()
def hand_made(tmp_path):
    """A WSD curve logged every 10 steps with 0.2 % noise, and a longer schedule given by four rows."""
    lr = _rates(STEPS, 480)
    steps = np.arange(10, STEPS + 1, 10)
    loss = _truth(lr, steps) * np.exp(np.random.default_rng(0).normal(0, 0.002, steps.size))
    curve = tmp_path / "curve.csv"
    lines = ["step,lr,loss", f"0,{lr[0]},"]
    lines += [f"{s},{float(lr[s - 1])!r},{float(v)!r}" for s, v in zip(steps, loss)]
    curve.write_text("\n".join(lines) + "\n")
    schedule = tmp_path / "longer.csv"
    schedule.write_text("step,lr\n0,0\n20,4e-3\n700,4e-3\n1000,8e-5\n")
    return curve, schedule


def test_fit_help_lists_every_law(capsys):
    with pytest.raises(SystemExit):
        main(["scaling", "fit", "--help"])
    out = capsys.readouterr().out
    for name in LAWS:
        assert name in out


def test_a_hand_made_curve_is_fitted_and_predicted_along_a_longer_schedule(hand_made, tmp_path, capsys):
    curve, schedule = hand_made
    out = tmp_path / "fit"
    assert (
        main(["scaling", "fit", "--law", "tissue", "--bootstrap", "40", "--out", str(out), str(curve)]) == 0
    )
    saved = Fit.load(out / "fit.json")
    assert saved.identified, saved.reasons
    assert saved.params["alpha"] == pytest.approx(TRUTH["alpha"], rel=0.1)
    pred_path = tmp_path / "pred.json"
    assert (
        main(
            [
                "scaling",
                "predict",
                str(out / "fit.json"),
                "--schedule",
                str(schedule),
                "--out",
                str(pred_path),
            ]
        )
        == 0
    )
    record = json.loads(pred_path.read_text())
    assert record["law"] == "tissue"
    rows = record["predictions"]
    assert [r["step"] for r in rows] == sorted({r["step"] for r in rows}) and rows[-1]["step"] == 1000
    assert {"step", "loss", "low", "high"} <= set(rows[-1])
    lr = np.interp(np.arange(1, 1001), [0, 20, 700, 1000], [0, 4e-3, 4e-3, 8e-5])
    truth = float(_truth(lr, np.array([1000]))[0])
    assert abs(rows[-1]["loss"] - truth) < 0.02
    assert rows[-1]["low"] <= rows[-1]["loss"] <= rows[-1]["high"]
    assert pred_path.with_suffix(".png").stat().st_size > 0
    assert "step 1000" in capsys.readouterr().out


def test_results_tables_give_a_size_law_per_family_and_predict_at_sizes(tmp_path, capsys):
    table = tmp_path / "results.csv"
    rows = [
        "run,family,size,params,nonembedding_params,linear_params,tokens,flops,bits_per_param,step,eval,loss"
    ]
    for n in (1e5, 3e5, 1e6, 3e6):
        for d in (1e6, 3e6, 1e7):
            loss = 2.0 + 300 / n**0.4 + 500 / d**0.35
            rows.append(f"floatlm-{n:g}-{d:g},floatlm,s,{n:g},{n:g},{n:g},{d:g},1,16,10,val_loss,{loss!r}")
    table.write_text("\n".join(rows) + "\n")
    out = tmp_path / "nd"
    assert (
        main(["scaling", "fit", "--law", "additive", "--bootstrap", "0", "--out", str(out), str(table)]) == 0
    )
    fit = Fit.load(out / "fit.json")
    assert fit.params["E"] == pytest.approx(2.0, rel=1e-3)
    pred = tmp_path / "p.json"
    args = [
        "scaling",
        "predict",
        str(out / "fit.json"),
        "--params",
        "1e7",
        "--tokens",
        "1e8",
        "--out",
        str(pred),
    ]
    assert main([*args, "--no-plot"]) == 0
    got = json.loads(pred.read_text())["predictions"]
    assert got == [
        {
            "params": 1e7,
            "tokens": 1e8,
            "loss": pytest.approx(2.0 + 300 / 1e7**0.4 + 500 / 1e8**0.35),
            "low": None,
            "high": None,
        }
    ]
    assert main(["scaling", "predict", str(out / "fit.json"), "--params", "1e7"]) == 2
    assert "needs --tokens" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, message",
    [
        ("step,lr,loss\n1,0.1,3.0\n2,abc,2.9\n", "line 3: column 'lr' must be a number"),
        ("step,lr,loss\n1,0.1,3.0\n2.5,0.1,2.9\n", "line 3: column 'step' must be a whole number"),
        ("step,lr,loss\n1,0.1,3.0\n2,0.1\n", "line 3: 2 cells for 3 columns"),
        ("lr,loss\n0.1,3.0\n", "line 2: no 'step' column"),
        ("step,loss\n1,3.0\n", "no row has an 'lr'"),
        ("step,lr,loss\n1,0.1,-3\n", "line 2: column 'loss' must be positive"),
        ("step,lr,loss\n1,0.1,3\n5,0.1,\n9,,2.5\n", "line 4: a loss at step 9 lies outside the schedule"),
    ],
)
def test_malformed_curve_tables_name_the_file_line_and_column(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(Exception, match=message) as info:
        read_curve(path)
    assert str(path) in str(info.value)
    assert main(["scaling", "fit", "--law", "tissue", "--out", str(tmp_path / "o"), str(path)]) == 2


def test_jsonl_curves_merge_rows_of_a_step_as_a_resumed_run_logs_them(tmp_path):
    path = tmp_path / "metrics.jsonl"
    records = [
        {"step": 10, "lr": 1e-3, "loss": 4.0, "tokens": 1},
        {"step": 20, "lr": 1e-3, "loss": 3.9},
        {"step": 20, "val_loss": 3.95},
        {"step": 20, "lr": 1e-3, "loss": 3.8},
        {"step": 30, "lr": 5e-4, "loss": 3.7},
    ]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    curve = read_curve(path)
    assert curve.steps.tolist() == [10, 20, 30] and curve.loss.tolist() == [4.0, 3.8, 3.7]
    assert read_curve(path, loss_column="val_loss").steps.tolist() == [20]
    path.write_text('{"step": 1, "lr": 1e-3, "loss": 4.0}\n[1, 2]\n')
    with pytest.raises(Exception, match="line 2: expected an object"):
        read_curve(path)
