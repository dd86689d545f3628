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

import pytest

from trilm.testing.cluster import slurm
from trilm.testing.cluster.drills import cancel_suite_run, compare_runs, events
from trilm.testing.cluster.launchers import ROOT, node_env, venv_tool
from trilm.testing.cluster.processes import ProcessSet

from .conftest import LAUNCH_TIMEOUT, MULTINODE_STEPS, SUITE_STEPS, multinode_config, slurm_suite

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.slow,
    pytest.mark.skipif(bool(slurm.missing()), reason="; ".join(slurm.missing())),
]


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
    assert states[job].state == "COMPLETED" and states[job].exit_code == "0:0", f"{states}\n{log[-6000:]}"
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


def test_suite_array_with_a_cancelled_run_resumes(cluster, prepared, tmp_path):
    suite_file = slurm_suite(tmp_path, prepared)
    root = tmp_path / "runs"
    with ProcessSet(tmp_path / "logs") as processes:
        drill = cancel_suite_run(cluster, processes, suite_file, root, after_step=10, timeout=LAUNCH_TIMEOUT)
    first, _status, again = drill.outputs
    assert drill.runs == ["trilm-nano", "floatlm-nano"] and f"job {drill.job}" in first, first
    array = drill.array_script
    assert "#SBATCH --array=0-1" in array and "#SBATCH --cpus-per-task=1" in array
    assert "--gpus-per-node" not in array  # a CPU suite asks for no GPUs

    job = drill.job
    assert drill.states == {f"{job}_0": "CANCELLED 0:0", f"{job}_1": "COMPLETED 0:0"}, drill.states
    assert drill.complete_states and max(drill.complete_states) < SUITE_STEPS
    assert drill.status == {"trilm-nano": "stopped", "floatlm-nano": "finished"}
    assert "floatlm-nano" in again and "skipped" in again, again
    assert drill.resubmitted_runs == ["trilm-nano"]
    assert drill.resubmitted_states == {f"{drill.resubmitted_job}_0": "COMPLETED 0:0"}
    assert drill.resumed_from == [max(drill.complete_states)]

    assert drill.straight_code == 0  # the uninterrupted run of the same config
    comparison = compare_runs(drill.straight, drill.run_dir)
    assert comparison.identical, comparison  # losses, validation losses, final weights: bitwise
