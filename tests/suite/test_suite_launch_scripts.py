"""``trilm suite launch --slurm / --hostfile``: valid scripts, written without submitting (or submitted to a
stand-in ``sbatch``), and no run submitted twice while SLURM still has it."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from trilm.cli import main
from trilm.config import ConfigError
from trilm.suite import load_suite
from trilm.suite.launch import launch_hostfile, launch_slurm, read_hostfile
from trilm.train.config import TrainConfig


def _bash_ok(path: Path) -> None:
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _sbatch(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"#SBATCH --([\w-]+)(?:=(.*))?$", line)
        if m:
            out[m.group(1)] = m.group(2) or ""
    return out


def test_slurm_dry_run_writes_valid_scripts(tmp_path, capsys):
    root = tmp_path / "spectra"
    assert main(["suite", "launch", "spectra", "--slurm", "--dry-run", "--run-dir", str(root)]) == 0
    out = capsys.readouterr().out
    suite = load_suite("spectra", root=root)
    arrays = sorted((root / "launch").glob("array-*.sbatch"))
    assert [p.name for p in arrays] == [f"array-{n}x8.sbatch" for n in (1, 2, 3, 6)]
    shapes = {p.name: _sbatch(p) for p in arrays}
    assert shapes["array-1x8.sbatch"]["array"] == "0-9" and shapes["array-1x8.sbatch"]["nodes"] == "1"
    assert shapes["array-6x8.sbatch"]["array"] == "0-1" and shapes["array-6x8.sbatch"]["nodes"] == "6"
    assert all(s["gpus-per-node"] == "8" and "exclusive" in s for s in shapes.values())
    for path in arrays:
        _bash_ok(path)
        assert f"would submit: sbatch {path}" in out
    for run in suite.runs:
        script = root / "launch" / f"{run.name}.sh"
        _bash_ok(script)
        text = script.read_text()
        assert f"export PROCS_PER_NODE={min(run.devices, 8)} " in text
        assert f"exec srun --nodes {run.nodes} --ntasks-per-node=1 --kill-on-bad-exit=1" in text
        assert "scontrol show hostnames" in text and "configs/launch/deepspeed-node.sh" in text
        config = re.search(r"^CONFIG=(\S+)$", text, re.M).group(1)
        assert TrainConfig.from_yaml(config).to_dict() == run.cfg.to_dict()
    array = (root / "launch" / "array-6x8.sbatch").read_text()
    assert "trilm-3.9b.sh" in array and "floatlm-3.9b.sh" in array
    assert not (root / "launch" / "jobs.jsonl").exists()  # nothing submitted


def _fake_slurm(bin_dir: Path, live: str) -> Path:
    """``sbatch`` printing job ids 1001, 1002, … and logging its arguments; ``squeue`` printing ``live``."""
    bin_dir.mkdir()
    log = bin_dir / "sbatch.log"
    (bin_dir / "sbatch").write_text(
        f'#!/usr/bin/env bash\necho "$@" >> {log}\nn=$(wc -l < {log})\necho "$((1000 + n));cluster"\n'
    )
    (bin_dir / "squeue").write_text(f"#!/usr/bin/env bash\nprintf '{live}'\n")
    for name in ("sbatch", "squeue"):
        (bin_dir / name).chmod(0o755)
    return log


def test_slurm_submission_is_recorded_and_not_repeated(tmp_path, monkeypatch):
    log = _fake_slurm(tmp_path / "bin", live="1001 0\\n1001 1\\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{__import__('os').environ['PATH']}")
    suite = load_suite("spectra", root=tmp_path / "spectra")
    first = launch_slurm(suite, suite.runs, echo=lambda _: None)
    assert [o.action for o in first] == ["submitted"] * 18
    assert len(log.read_text().splitlines()) == 4
    records = [json.loads(line) for line in (tmp_path / "spectra/launch/jobs.jsonl").read_text().splitlines()]
    assert records[0]["job"] == "1001" and records[0]["runs"][:2] == ["trilm-99m", "trilm-190m"]
    # squeue still lists tasks 0 and 1 of job 1001: those two runs are not submitted again
    again = {o.run: o for o in launch_slurm(suite, suite.runs, echo=lambda _: None)}
    assert again["trilm-99m"].action == "queued" and "1001_0" in again["trilm-99m"].detail
    assert again["trilm-190m"].action == "queued"
    assert sum(o.action == "submitted" for o in again.values()) == 16
    array = _sbatch(Path(log.read_text().splitlines()[-1].split()[-1]))
    assert array["array"] == "0-1"  # the 6-node array, resubmitted whole


def test_hostfile_scripts(tmp_path, capsys):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two nodes\nnode-a slots=8\nnode-b slots=8  # second\n")
    assert read_hostfile(hostfile) == [("node-a", 8), ("node-b", 8)]
    suite = load_suite("spectra", root=tmp_path / "spectra")
    small = [r for r in suite.runs if r.nodes <= 2]
    outcomes = launch_hostfile(suite, small, hostfile, dry_run=True, echo=lambda _: None)
    assert [o.action for o in outcomes] == ["written"] * len(small) == ["written"] * 14
    script = tmp_path / "spectra/launch/trilm-1.5b.sh"
    _bash_ok(script)
    text = script.read_text()
    assert f"HOSTFILE={hostfile}" in text and "--num_nodes 2 --num_gpus 8" in text
    assert "SLURM" not in text
    with pytest.raises(ConfigError, match=r"hosts: run trilm-2\.4b needs 3 node\(s\) with 8 slots"):
        launch_hostfile(suite, suite.runs, hostfile, dry_run=True, echo=lambda _: None)
    hostfile.write_text("node-a slots=8\nnode-b 8\n")
    with pytest.raises(ConfigError, match=r"hosts line 2: expected 'HOST slots=N', got 'node-b 8'"):
        read_hostfile(hostfile)
