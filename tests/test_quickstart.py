"""The main job end to end at a reduced budget: data → TriLM + FloatLM → loss table → samples → scaling."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trilm.cli import main as trilm_main
from trilm.eval.suite import evaluate_snapshot, suite_rows
from trilm.scaling.table import read_table


@pytest.mark.slow
def test_quickstart_pipeline(tmp_path, capsys):
    assert (
        trilm_main(["quickstart", "--run-dir", str(tmp_path), "--tokens", str(8192 * 5), "--no-progress"])
        == 0
    )
    out = capsys.readouterr().out
    assert "validation loss per checkpoint" in out and "[trilm] In the beginning" in out
    rows = read_table(tmp_path / "results.csv")
    assert {r.family for r in rows} == {"trilm", "floatlm"}
    assert sorted({r.step for r in rows}) == [0, 1, 2, 4, 5]
    trilm = {r.step: r for r in rows if r.family == "trilm"}
    assert trilm[5].loss < trilm[0].loss and trilm[5].tokens == 5 * 8192
    assert 1.5 < trilm[5].bits_per_param < 16 and {
        r.bits_per_param for r in rows if r.family == "floatlm"
    } == {16.0}
    report = json.loads((tmp_path / "analysis/fit.json").read_text())
    assert set(report["families"]) == {"trilm", "floatlm"}
    for name in ("report.md", "training_curves.png", "loss_vs_params.svg"):
        assert (tmp_path / "analysis" / name).stat().st_size > 0
    # the recorded snapshot loss is what an independent evaluation of the snapshot gives
    snap = tmp_path / "trilm-tiny/snapshots/step-5"
    again = evaluate_snapshot(
        snap, tmp_path / "data/validation", seq_len=128, batch_size=32, max_sequences=64
    )
    assert again == pytest.approx(trilm[5].loss, rel=1e-5)
    assert len(suite_rows(tmp_path / "floatlm-tiny")) == 5

    # the thin checkpoint tool indexes the same suite and appends nothing new to the table
    tool = Path(__file__).resolve().parents[1] / "checkpoints_tools/suite_index.py"
    run = subprocess.run(
        [sys.executable, str(tool), str(tmp_path / "trilm-tiny"), "--table", str(tmp_path / "results.csv")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "0 rows added, 5 already present" in run.stdout
    index = json.loads((tmp_path / "trilm-tiny/suite_index.json").read_text())
    assert [e["step"] for e in index] == [0, 1, 2, 4, 5] and index[-1]["tokens"] == 5 * 8192
