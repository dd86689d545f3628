"""A real SLURM started by the test (Debian's slurm-wlm: munged, slurmctld, two slurmd on 127.0.0.1 and
127.0.0.2; accounting through slurmdbd over a private MariaDB when installed), without cgroups or GPUs:

- ``configs/launch/pretrain.sbatch`` on 2 nodes × 2 processes, its GPU request overridden for CPU nodes:
  the job completes (squeue, then sacct) with the losses and final weights of the 1-node 4-process run;
- the array ``trilm suite launch --slurm`` writes for a 2-run CPU suite: both runs are submitted as one
  array; one task is ``scancel``led mid-run, the other finishes; relaunching the suite submits only the
  cancelled run, which resumes from its newest complete state to the weights of an uninterrupted run.

Skipped, with the reason, where the SLURM packages are absent (``.ci/run`` installs them).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.suite.conftest import write_suite
from trilm.testing import slurm
from trilm.testing.drills import compare_runs, events, final_weights, last_logged_step, resumed_from
from trilm.testing.launchers import ROOT, node_env, venv_tool
from trilm.testing.processes import ProcessSet
from trilm.train.checkpoint import RunDir, complete_steps
from trilm.train.config import TrainConfig

from .conftest import LAUNCH_TIMEOUT, MULTINODE_STEPS, multinode_config

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.slow,
    pytest.mark.skipif(bool(slurm.missing()), reason="; ".join(slurm.missing())),
]
SUITE_STEPS = 64


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    processes = ProcessSet(tmp_path_factory.mktemp("slurm-daemons"))
    cluster = slurm.LoopbackSlurm(processes, nodes=2)
    try:
        yield cluster.start()
    finally:
        processes.close()  # every daemon and every job process (they carry the set's tag)
        cluster.close()


def test_pretrain_sbatch_on_two_cpu_nodes(cluster, one_node_run, prepared, tmp_path):
    run = tmp_path / "run"
    config = multinode_config(prepared, run)
    out = tmp_path / "job.out"
    job = cluster.sbatch(
        ["--nodes=2", "--gpus-per-node=0", f"--output={out}", "configs/launch/pretrain.sbatch", str(config)],
        cwd=ROOT,
        env=node_env({"PROCS_PER_NODE": "2", "DEEPSPEED": venv_tool("deepspeed")}),
    )
    states = cluster.wait([job], timeout=LAUNCH_TIMEOUT)
    log = out.read_text()
    assert states[job].state == "COMPLETED" and states[job].exit_code == "0:0", (states, log[-4000:])
    assert states[job].nodes == "n[1-2]"
    assert f"trilm: job {job} on n[1-2]: 2 node(s) x 2 process(es), rank 0 at 127.0.0.1:" in log
    comparison = compare_runs(one_node_run, run)
    assert comparison.steps == MULTINODE_STEPS and comparison.identical, comparison
    (placement,) = events(run, "placement")
    assert placement["nodes"] == {"0": [0, 1], "1": [2, 3]}


def test_pretrain_sbatch_without_gpus_asks_for_processes_per_node(cluster, prepared, tmp_path):
    out = tmp_path / "job.out"
    job = cluster.sbatch(
        [
            "--nodes=1",
            "--gpus-per-node=0",
            f"--output={out}",
            "configs/launch/pretrain.sbatch",
            "unused.yaml",
        ],
        cwd=ROOT,
        env=node_env(),
    )
    states = cluster.wait([job], timeout=120)
    assert states[job].state == "FAILED" and states[job].exit_code == "2:0", states
    assert "no GPUs allocated on the node: set PROCS_PER_NODE" in out.read_text()


def _suite_cli(cluster, args: list[str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "trilm.cli", "suite", *args],
        env=cluster.submit_env(node_env({"DEEPSPEED": venv_tool("deepspeed")})),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _jobs(root) -> list[dict]:
    return [json.loads(line) for line in (root / "runs/launch/jobs.jsonl").read_text().splitlines()]


def _wait_for(predicate, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def test_suite_array_with_a_cancelled_run_resumes(cluster, prepared, tmp_path):
    suite_file = write_suite(tmp_path, prepared, name="slurmtoy", steps=SUITE_STEPS, sizes=[{"name": "nano"}])
    launch = ["launch", str(suite_file), "--slurm", "--no-progress"]
    first = _suite_cli(cluster, launch)
    (record,) = _jobs(tmp_path)
    job, runs = record["job"], record["runs"]
    assert runs == ["trilm-nano", "floatlm-nano"] and f"job {job}" in first
    array = (tmp_path / "runs/launch/array-1x1.sbatch").read_text()
    assert "#SBATCH --array=0-1" in array and "#SBATCH --cpus-per-task=1" in array
    assert "--gpus-per-node" not in array  # a CPU suite asks for no GPUs

    cancelled = tmp_path / "runs/trilm-nano"
    _wait_for(
        lambda: last_logged_step(cancelled) >= 10 and complete_steps(RunDir(cancelled).state),
        "trilm-nano never reached step 10",
        LAUNCH_TIMEOUT,
    )
    cluster.scancel(f"{job}_0")
    states = cluster.wait([job], timeout=LAUNCH_TIMEOUT)
    assert states[f"{job}_0"].state == "CANCELLED", states
    assert states[f"{job}_1"].state == "COMPLETED" and states[f"{job}_1"].exit_code == "0:0", states
    left = [step for step, _ in complete_steps(RunDir(cancelled).state)]
    assert left and max(left) < SUITE_STEPS

    status = json.loads(_suite_cli(cluster, ["status", str(suite_file), "--json"]))
    assert {r["run"]: r["state"] for r in status} == {"trilm-nano": "stopped", "floatlm-nano": "finished"}

    again = _suite_cli(cluster, launch)
    assert "floatlm-nano" in again and "skipped" in again
    second = _jobs(tmp_path)[-1]
    assert second["runs"] == ["trilm-nano"]
    states = cluster.wait([second["job"]], timeout=LAUNCH_TIMEOUT)
    assert states[f"{second['job']}_0"].state == "COMPLETED", states
    assert resumed_from(cancelled) == [max(left)]

    # the uninterrupted run of the same config, one process as in the array task
    config = TrainConfig.from_yaml(tmp_path / "runs/configs/trilm-nano.yaml")
    straight = tmp_path / "straight"
    config.replace(run_dir=str(straight)).to_yaml(tmp_path / "straight.yaml")
    with ProcessSet(tmp_path / "logs") as processes:
        code, output = processes.run(
            "straight",
            [sys.executable, str(ROOT / "train/pretrain.py"), "--config", str(tmp_path / "straight.yaml")],
            env=node_env(),
            cwd=ROOT,
            timeout=LAUNCH_TIMEOUT,
        )
    assert code == 0, output[-3000:]
    weights, reference = final_weights(cancelled), final_weights(straight)
    assert all(weights[k].equal(reference[k]) for k in reference)
    assert compare_runs(straight, cancelled).identical
