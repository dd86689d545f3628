"""A real toy suite (TriLM and FloatLM at two sizes) trained once: status of a half-finished copy, an
idempotent relaunch that skips finished runs and resumes the interrupted one, and the analysis with its
family comparison made from real snapshots."""

from __future__ import annotations

import json
import os
import shutil
import time

from safetensors.torch import load_file

from tests.suite.conftest import copy_suite
from trilm.cli import main
from trilm.eval.suite import write_suite_table
from trilm.scaling import analyse, read_table
from trilm.suite.analyse import analyse_suite, summary_text
from trilm.suite.launch import launch_local
from trilm.suite.status import render_status, run_status, suite_status
from trilm.train.checkpoint import RunLock


def _interrupt(run, at_state: int, metrics_until: int) -> None:
    """Make a finished run look killed after its state ``at_state`` (metrics logged to ``metrics_until``)."""
    for parent in (run.run_dir / "state", run.run_dir / "snapshots"):
        for child in parent.iterdir():
            if int(child.name.split("-")[1]) > at_state:
                shutil.rmtree(child)
    metrics = run.run_dir / "logs/metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records if r["step"] <= metrics_until))
    old = time.time() - 3600
    os.utime(metrics, (old, old))


def _half_finished(trained, prepared, tmp_path):
    suite = copy_suite(trained, prepared, tmp_path)
    _interrupt(suite.run("floatlm-nano"), at_state=4, metrics_until=6)
    shutil.rmtree(suite.run("trilm-nano").run_dir)
    return suite


def test_status_of_a_half_finished_suite(trained, prepared, tmp_path, capsys):
    suite = _half_finished(trained, prepared, tmp_path)
    by_name = {s.run.name: s for s in suite_status(suite)}
    assert {n: s.state for n, s in by_name.items()} == {
        "trilm-pico": "finished",
        "trilm-nano": "pending",
        "floatlm-pico": "finished",
        "floatlm-nano": "stopped",
    }
    stopped = by_name["floatlm-nano"]
    assert (stopped.step, stopped.last_snapshot, stopped.last_state) == (6, 4, 4)
    assert stopped.tokens == 6 * 1024 and stopped.steps == 8
    metrics = stopped.run.run_dir / "logs/metrics.jsonl"
    logged = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert stopped.train_loss == [r["loss"] for r in logged if "loss" in r][-1]
    assert stopped.tokens_per_s > 0 and stopped.eta_s == (8 - 6) * 1024 / stopped.tokens_per_s
    snap = json.loads((stopped.run.run_dir / "snapshots/step-4/config.json").read_text())["meta"]
    assert stopped.val_loss == snap["val_loss"]
    finished = by_name["trilm-pico"]
    assert finished.step == 8 and finished.eta_s == 0 and finished.val_loss is not None

    assert main(["suite", "status", str(suite.path)]) == 0
    out = capsys.readouterr().out
    assert "2 finished, 1 stopped, 1 pending" in out
    line = next(r for r in out.splitlines() if r.startswith("floatlm-nano"))
    assert line.split()[:4] == ["floatlm-nano", "stopped", "6/8", "6.14k/8.19k"]
    assert render_status(suite, list(by_name.values())).count("done") == 2


def test_relaunch_skips_finished_and_resumes_interrupted(trained, prepared, tmp_path):
    suite = _half_finished(trained, prepared, tmp_path)
    finished_snapshot = suite.run("trilm-pico").run_dir / "snapshots/step-8/model.safetensors"
    before = finished_snapshot.stat().st_mtime_ns
    outcomes = {o.run: o for o in launch_local(suite, suite.runs, progress=False, echo=lambda _: None)}
    assert outcomes["trilm-pico"].action == outcomes["floatlm-pico"].action == "skipped"
    assert outcomes["floatlm-nano"].action == "resumed" and outcomes["trilm-nano"].action == "trained"
    assert finished_snapshot.stat().st_mtime_ns == before
    assert all(s.state == "finished" for s in suite_status(suite))
    # the resumed run ends with the weights of the uninterrupted one (bitwise on CPU)
    resumed = load_file(str(suite.run("floatlm-nano").run_dir / "snapshots/step-8/model.safetensors"))
    original = load_file(str(trained / "runs/floatlm-nano/snapshots/step-8/model.safetensors"))
    assert resumed.keys() == original.keys()
    assert all(resumed[k].equal(original[k]) for k in resumed)
    # a second relaunch has nothing to do
    again = launch_local(suite, suite.runs, progress=False, echo=lambda _: None)
    assert [o.action for o in again] == ["skipped"] * 4


def test_a_run_being_trained_is_not_started_twice_and_a_killed_one_is_resumed(trained, prepared, tmp_path):
    """'running' is a live process holding the run's lock, not a recent metrics log: a run killed with
    kill -9 a second ago (fresh metrics, a lock file nobody holds) is resumed at once."""
    suite = copy_suite(trained, prepared, tmp_path)
    run = suite.run("floatlm-nano")
    _interrupt(run, at_state=4, metrics_until=6)
    os.utime(run.run_dir / "logs/metrics.jsonl")  # written just now
    assert (run.run_dir / ".lock").is_file() and run_status(run).state == "stopped"
    with RunLock(run.run_dir):  # another process trains it
        assert run_status(run).state == "running"
        outcome = launch_local(suite, [run], progress=False, dry_run=True, echo=lambda _: None)[0]
        assert outcome.action == "running elsewhere" and "--force" in outcome.detail
        assert f"pid {os.getpid()}" in outcome.detail
    outcome = launch_local(suite, [run], progress=False, dry_run=True, echo=lambda _: None)[0]
    assert outcome.action == "would train" and "resumes from step 4" in outcome.detail


def test_a_run_locked_on_another_host_is_judged_by_its_metrics(trained, prepared, tmp_path):
    """The lock file names another host (a cluster node): its lock may be invisible here, so a fresh
    metrics log still means running (no second training is started), and a stale one stopped."""
    suite = copy_suite(trained, prepared, tmp_path)
    run = suite.run("floatlm-nano")
    _interrupt(run, at_state=4, metrics_until=6)
    os.utime(run.run_dir / "logs/metrics.jsonl")
    lock = run.run_dir / ".lock"
    lock.write_text(lock.read_text().replace(" on ", " on another-host-", 1))
    assert run_status(run).state == "running"
    assert run_status(run, now=time.time() + 3600).state == "stopped"


def test_family_comparison_on_real_snapshots(trained, tmp_path):
    """The snapshots' ``size`` is family-free, so TriLM and FloatLM rows of one size pair up."""
    runs = [trained / "runs" / name for name in ("trilm-nano", "floatlm-nano")]
    added, _ = write_suite_table(runs, tmp_path / "results.csv")
    rows = read_table(tmp_path / "results.csv")
    assert added == len(rows) > 0 and {r.size for r in rows} == {"nano"}
    report = analyse([tmp_path / "results.csv"], None, bootstrap=0, plots=False)
    observed = [c for c in report.comparisons if c["axis"] == "observed"]
    assert len(observed) == 1 and observed[0]["family"] == "trilm"
    (pair,) = observed[0]["shared_sizes"]
    finals = {r.family: r for r in rows if r.step == 8}
    assert pair["size"] == "nano" and pair["loss"] == finals["trilm"].loss
    assert pair["difference"] == finals["trilm"].loss - finals["floatlm"].loss


def test_analyse_two_sizes_two_families(trained, prepared, tmp_path, capsys):
    suite = copy_suite(trained, prepared, tmp_path)
    result = analyse_suite(suite, bootstrap=20, echo=lambda _: None)
    rows = read_table(result.table)
    pairs = {(f, s) for f in ("trilm", "floatlm") for s in ("pico", "nano")}
    assert {(r.family, r.size) for r in rows} == pairs
    assert result.added == len(rows) == 4 * 5  # snapshots 0, 1, 2, 4, 8 of each run
    observed = next(c for c in result.report.comparisons if c["axis"] == "observed")
    assert [p["size"] for p in observed["shared_sizes"]] == ["pico", "nano"]
    # two sizes cannot identify E + A/N^α: the analysis says so instead of fitting
    assert any("L(N) not fitted" in n for n in result.report.notes)
    summary = (result.out_dir / "suite.md").read_text()
    assert "| size | params | non-emb | FloatLM | TriLM | TriLM−FloatLM |" in summary
    for name in ("report.md", "fit.json", "loss_vs_params.png", "loss_vs_bits.svg", "training_curves.png"):
        assert (result.out_dir / name).stat().st_size > 0
    text = summary_text(result.report)
    assert "TriLM−FloatLM" in text and "nano" in text

    # the command does the same in one go, and a rerun adds no rows
    assert main(["suite", "analyse", str(suite.path), "--bootstrap", "0", "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "0 rows added, 20 already there" in out and "final validation loss per size" in out
    assert (
        main(
            [
                "suite",
                "analyse",
                str(suite.path),
                "--bootstrap",
                "0",
                "--no-plots",
                "--x",
                "nonembedding_params",
            ]
        )
        == 0
    )
    fit = json.loads((result.out_dir / "fit.json").read_text())
    assert fit["x_axis"] == "nonembedding_params"


def test_jobs_train_runs_side_by_side_and_record_a_failure(trained, prepared, tmp_path):
    suite = _half_finished(trained, prepared, tmp_path)
    broken = suite.run("trilm-pico").run_dir
    _interrupt(suite.run("trilm-pico"), at_state=4, metrics_until=6)
    (broken / "resolved_config.yaml").unlink()  # checkpoints without their config: the trainer refuses
    lines: list[str] = []
    outcomes = {o.run: o for o in launch_local(suite, suite.runs, progress=False, jobs=2, echo=lines.append)}
    assert outcomes["floatlm-pico"].action == "skipped"
    assert outcomes["floatlm-nano"].action == "resumed" and outcomes["trilm-nano"].action == "trained"
    assert outcomes["trilm-pico"].action == "failed" and "train.log" in outcomes["trilm-pico"].detail
    assert "refusing to mix" in (broken / "FAILED").read_text()
    assert any("2 at a time" in line for line in lines)
    states = {s.run.name: s.state for s in suite_status(suite)}
    assert states == {"trilm-pico": "failed", "trilm-nano": "finished", "floatlm-pico": "finished",
                      "floatlm-nano": "finished"}  # fmt: skip
    log = (suite.run("trilm-nano").run_dir / "train.log").read_text()
    assert "Traceback" not in log
    resumed = suite.run("floatlm-nano").run_dir / "snapshots/step-8/config.json"
    original = trained / "runs/floatlm-nano/snapshots/step-8/config.json"
    loss = [json.loads(p.read_text())["meta"]["val_loss"] for p in (resumed, original)]
    assert abs(loss[0] - loss[1]) < 1e-3  # one thread instead of several: the same run up to rounding


def test_runs_are_dealt_largest_first_to_the_least_loaded_worker():
    from trilm.suite.jobs import deal

    assert deal([1.0, 5.0, 2.0, 4.0, 3.0], 2) == [[0, 1, 2], [3, 4]]  # loads 8 and 7
    assert deal([1.0, 1.0], 4) == [[0], [1]]  # never an idle worker
