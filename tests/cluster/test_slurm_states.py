"""Final job states without accounting: read from ``scontrol show job`` (a stand-in prints what SLURM 22.05
prints), array tasks named ``job_task`` as sacct names them."""

from __future__ import annotations

import os

from trilm.testing.cluster.processes import ProcessSet
from trilm.testing.cluster.slurm import JobState, LoopbackSlurm


def test_states_from_scontrol_when_there_is_no_accounting(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    lines = {
        "7": "JobId=7 JobName=trilm UserId=root(0) JobState=COMPLETED ExitCode=0:0 NodeList=n[1-2]",
        "8": "JobId=9 ArrayJobId=8 ArrayTaskId=0 JobState=CANCELLED Reason=None ExitCode=0:15 NodeList=n1\n"
        "JobId=10 ArrayJobId=8 ArrayTaskId=1 JobState=COMPLETED Reason=None ExitCode=0:0 NodeList=n2",
    }
    (bin_dir / "scontrol").write_text(
        "#!/usr/bin/env bash\n"
        + "".join(f'if [ "$4" = {job} ]; then cat <<"EOF"\n{text}\nEOF\nfi\n' for job, text in lines.items())
    )
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with ProcessSet(tmp_path / "logs") as processes:
        cluster = LoopbackSlurm(processes)
        try:
            cluster.accounting = False
            states = cluster.final_states(["7", "8"])
        finally:
            cluster.close()
    assert states == {
        "7": JobState("7", "COMPLETED", "0:0", "n[1-2]"),
        "8_0": JobState("8_0", "CANCELLED", "0:15", "n1"),
        "8_1": JobState("8_1", "COMPLETED", "0:0", "n2"),
    }
