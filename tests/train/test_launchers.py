"""The DeepSpeed launcher across two loopback hosts (127.0.0.1 and 127.0.0.2, 2 processes each, TP 2 × DP 2):

- once per node with ``--no_ssh --node_rank r`` over one hostfile (what a scheduler starting one task per
  node does);
- its default path: one ``deepspeed --hostfile`` reaching both hosts through pdsh and ssh, against an sshd
  on loopback (skipped, with the reason, where sshd or pdsh is not installed);

each with the per-step losses, validation losses and final weights of the 1-node 4-process run, bitwise.
"""

from __future__ import annotations

import pytest

from trilm.testing.cluster import sshd
from trilm.testing.cluster.drills import compare_runs, events, run_to_end
from trilm.testing.cluster.launchers import DeepSpeedNoSsh, DeepSpeedSsh
from trilm.testing.cluster.processes import ProcessSet

from .conftest import LAUNCH_TIMEOUT, MULTINODE_STEPS, multinode_config

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _check(reference, run) -> None:
    comparison = compare_runs(reference, run)
    assert comparison.steps == MULTINODE_STEPS and comparison.identical, comparison
    (placement,) = events(run, "placement")
    assert placement["nodes"] == {"0": [0, 1], "1": [2, 3]}  # node rank (CROSS_RANK) → global ranks
    assert placement["tensor_parallel_spans_nodes"] is False


def test_deepspeed_launcher_per_node_without_ssh(one_node_run, prepared, tmp_path):
    run = tmp_path / "run"
    config = multinode_config(prepared, run)
    launcher = DeepSpeedNoSsh(tmp_path / "hostfile", nodes=2, procs_per_node=2)
    with ProcessSet(tmp_path / "logs") as processes:
        outcome = run_to_end(processes, launcher, config, "deepspeed", LAUNCH_TIMEOUT)
    assert outcome.codes == [0, 0], outcome.tail()
    assert "WORLD INFO DICT: {'127.0.0.1': [0, 1], '127.0.0.2': [0, 1]}" in outcome.nodes[1].output()
    _check(one_node_run, run)


@pytest.mark.skipif(
    bool(sshd.missing()), reason=f"needs {', '.join(sshd.missing())} (Debian: openssh-server, pdsh)"
)
def test_deepspeed_launcher_over_pdsh_and_ssh(one_node_run, prepared, tmp_path):
    run = tmp_path / "run"
    config = multinode_config(prepared, run)
    with ProcessSet(tmp_path / "logs") as processes:
        server = sshd.LoopbackSshd(processes, tmp_path / "ssh").start()
        launcher = DeepSpeedSsh(tmp_path / "hostfile", nodes=2, procs_per_node=2, ssh_env=server.env)
        outcome = run_to_end(processes, launcher, config, "pdsh", LAUNCH_TIMEOUT)
    output = outcome.nodes[0].output()
    assert outcome.codes == [0], outcome.tail()
    assert "pdsh -S -f 1024 -w 127.0.0.1,127.0.0.2" in output  # the launcher went through pdsh …
    assert "127.0.0.2: " in output and "node_rank=1" in output  # … and node 1 answered over ssh
    _check(one_node_run, run)
