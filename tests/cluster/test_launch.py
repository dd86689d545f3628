"""A launch fails fast: a node lost before the rendezvous ends the launch in seconds with its log, and a
rendezvous port taken between ``free_port()`` and the bind is retried on another port.

Both happen beside other jobs: node 0 loses its port to another socket (``EADDRINUSE``), and without the
fast failure node 1 then waits in the rendezvous for torchrun's whole 15-minute timeout. The commands are real
torchrun nodes on loopback; the workers are a one-line script, so no training runs."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from trilm.testing.cluster import free_port, launchers
from trilm.testing.cluster.launchers import Launch, NodeFailed, Torchrun
from trilm.testing.cluster.processes import ProcessSet

pytestmark = pytest.mark.distributed


class RankEcho(Torchrun):
    """torchrun nodes whose workers only print their rank: the launch itself is what is under test."""

    def __init__(self, nodes: int, script: Path):
        super().__init__(nodes, 1)
        self.script = script

    def commands(self, config: Path, overrides: list[str], port: int) -> list[list[str]]:
        head = [cmd[: cmd.index(str(launchers.PRETRAIN))] for cmd in super().commands(config, [], port)]
        return [[*cmd, str(self.script)] for cmd in head]


@pytest.fixture
def echo(tmp_path) -> RankEcho:
    script = tmp_path / "echo_rank.py"
    script.write_text('import os\nprint("rank", os.environ["RANK"], flush=True)\n')
    return RankEcho(2, script)


def test_a_node_lost_before_the_rendezvous_fails_the_launch_within_seconds(echo, tmp_path):
    with ProcessSet(tmp_path / "logs") as processes:
        launch = Launch(processes, echo, tmp_path / "unused.yaml", "lost")
        started = time.monotonic()
        echo.kill_node(processes, "lost", 0)
        with pytest.raises(NodeFailed) as failed:
            launch.wait(timeout=900)
        elapsed = time.monotonic() - started
        node0, node1 = launch.nodes
        assert node1.returncode is not None  # the peer waiting in the rendezvous was killed, not left
    assert elapsed < 30, elapsed
    assert failed.value.node is node0
    message = str(failed.value)
    assert message.startswith("lost-node0 exited -9 ")
    assert f"log: {node0.log}" in message
    assert len(launch.ports) == 1  # a lost node is no reason to relaunch


def test_a_taken_rendezvous_port_is_retried_on_another(echo, tmp_path, monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = iter([port])
        monkeypatch.setattr(launchers, "free_port", lambda: next(ports, None) or free_port())
        with ProcessSet(tmp_path / "logs") as processes:
            launch = Launch(processes, echo, tmp_path / "unused.yaml", "taken")
            codes = launch.wait(timeout=300)
    node0, node1 = (node.output() for node in launch.nodes)  # both attempts: a relaunch appends
    assert codes == [0, 0], node0 + node1
    assert launch.ports[0] == port and len(launch.ports) == 2 and launch.ports[1] != port
    assert launchers.BIND_FAILURE.search(node0), node0
    assert "rank 0" in node0 and "rank 1" in node1
