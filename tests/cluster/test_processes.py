"""Tagged process trees: everything a command started is found and ended, including workers in their own
session (as torchrun starts them) and orphans whose parent is gone."""

from __future__ import annotations

import signal
import time

from trilm.testing.cluster.processes import ProcessSet, process_tree, tagged_pids


def _wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_node_and_its_detached_workers_are_killed_together(tmp_path):
    with ProcessSet(tmp_path) as processes:
        # a "launcher" with one worker in a new session and one ordinary child, plus a second node
        node = processes.start("node1", ["bash", "-c", "setsid sleep 300 & sleep 300 & wait"])
        other = processes.start("node0", ["sleep", "300"])
        _wait_for(lambda: len(tagged_pids(node.tag)) == 3)
        assert len(process_tree(node.proc.pid)) == 3
        node.kill()
        assert tagged_pids(node.tag) == [] and node.returncode == -signal.SIGKILL
        assert other.returncode is None and tagged_pids(other.tag) == [other.proc.pid]
        # an orphan: its parent exits, it lives on under init, still tagged
        orphan = processes.start("orphan", ["bash", "-c", "sleep 300 & echo started"])
        assert orphan.wait(30) == 0 and "started" in orphan.output()
        _wait_for(lambda: len(tagged_pids(orphan.tag)) == 1)
        prefix = processes.prefix
    assert tagged_pids(prefix) == []  # closing the set ended the orphan and the other node


def test_environment_filter_picks_one_node_of_a_shared_tag(tmp_path):
    with ProcessSet(tmp_path) as processes:
        env = {"SLURMD_NODENAME": "n2"}
        n2 = processes.start("jobs", ["sleep", "300"], env=env)
        processes.start("jobs", ["sleep", "300"], env={"SLURMD_NODENAME": "n1"})
        _wait_for(lambda: len(tagged_pids(processes.tag("jobs"))) == 2)
        assert tagged_pids(processes.tag("jobs"), where=env) == [n2.proc.pid]
