"""Training "nodes" on one machine: each launcher's exact command line, started as tagged process trees.

A node here is what a cluster node runs: one launcher (torchrun, or the DeepSpeed launcher) and the
training processes it starts. Two of them on one machine, on 127.0.0.1 and 127.0.0.2 (both loopback),
with a shared run directory, behave like two nodes on a shared filesystem: the rendezvous, the
collectives and the checkpoint protocol are the same; only the wire is shorter. Each launcher knows its
commands and how to kill everything one node runs at once (:meth:`Launcher.kill_node`), the failure the
multi-node tests and ``benchmarks/train/multinode.py`` inject. A :class:`Launch` watches one launch's nodes
together, so that a node lost at the start fails the launch at once instead of leaving its peers in the
rendezvous.

The training processes get one thread each (``OMP_NUM_THREADS=1``): results are compared bitwise with a
run at another node count, and a matmul split over a different number of threads sums in another order.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

from trilm.testing.cluster import free_port
from trilm.testing.cluster.processes import TAG_VAR, Launched, ProcessSet, signal_tagged

ROOT = Path(__file__).resolve().parents[3]
"""The checkout: the cluster launches its ``train/pretrain.py`` (``trilm.testing`` is not in the wheel)."""
PRETRAIN = ROOT / "train" / "pretrain.py"
LOOPBACK_HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4")


def venv_tool(name: str) -> str:
    """A console script of the running interpreter's environment (torchrun, deepspeed)."""
    return str(Path(sys.executable).parent / name)


NUMERICS_VARS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "TRILM_TEST_THREADS")
"""What decides the CPU code path (``make test-portability`` sets them): a rank started over ssh must run
the same kernels as the reference run, or the bitwise comparison measures the instruction set, not the
launcher."""


def node_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """What every training process needs here: one thread, and this checkout first on the path."""
    path = os.environ.get("PYTHONPATH", "")
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT),
        **(extra or {}),
    }


def write_hostfile(path: Path, nodes: int, slots: int) -> Path:
    """A DeepSpeed hostfile of ``nodes`` loopback hosts with ``slots`` processes each."""
    path.write_text("".join(f"{host} slots={slots}\n" for host in LOOPBACK_HOSTS[:nodes]))
    return path


def pretrain_args(config: Path, overrides: list[str]) -> list[str]:
    return [str(PRETRAIN), "--config", str(config), *overrides, "log.progress=false"]


class Launcher:
    """How one multi-node run is started on loopback, and how one of its nodes is killed."""

    name = ""
    nodes = 1
    procs_per_node = 1

    def commands(self, config: Path, overrides: list[str], port: int) -> list[list[str]]:
        raise NotImplementedError

    def node_tag(self, processes: ProcessSet, label: str, node: int) -> str:
        return processes.tag(f"{label}-node{node}")

    def start(
        self,
        processes: ProcessSet,
        config: Path,
        label: str,
        overrides: list[str] | None = None,
        port: int | None = None,
    ) -> list[Launched]:
        """Start every node (one :class:`Launched` per launcher process, in node order) with node 0
        serving the rendezvous on ``port`` (a free one if None). :class:`Launch` retries on another port
        when that one was taken meanwhile."""
        port = free_port() if port is None else port
        return [
            processes.start(f"{label}-node{i}", cmd, env=node_env(), cwd=ROOT)
            for i, cmd in enumerate(self.commands(config, overrides or [], port))
        ]

    def kill_node(self, processes: ProcessSet, label: str, node: int, sig: int = signal.SIGKILL) -> list[int]:
        """Signal everything node ``node`` runs at once: SIGKILL (the node died) or SIGSTOP (it hangs, its
        connections stay open); returns the pids signalled."""
        pids = set(signal_tagged(self.node_tag(processes, label, node), sig))
        for launched in processes.launched:
            if launched.tag == self.node_tag(processes, label, node):
                pids |= set(launched.signal(sig))
        return sorted(pids)

    def describe(self) -> str:
        return f"{self.name}: {self.nodes} node(s) × {self.procs_per_node} process(es)"


class Torchrun(Launcher):
    """``torchrun`` per node with a static rendezvous on node 0 (``--master-addr``/``--node-rank``)."""

    name = "torchrun"

    def __init__(self, nodes: int, procs_per_node: int):
        self.nodes = nodes
        self.procs_per_node = procs_per_node

    def commands(self, config: Path, overrides: list[str], port: int) -> list[list[str]]:
        if self.nodes == 1:
            head = [venv_tool("torchrun"), "--standalone", "--nproc-per-node", str(self.procs_per_node)]
            return [head + pretrain_args(config, overrides)]
        return [
            [
                venv_tool("torchrun"),
                f"--nnodes={self.nodes}",
                f"--nproc-per-node={self.procs_per_node}",
                f"--node-rank={rank}",
                f"--master-addr={LOOPBACK_HOSTS[0]}",
                f"--master-port={port}",
                f"--local-addr={LOOPBACK_HOSTS[rank]}",
                *pretrain_args(config, overrides),
            ]
            for rank in range(self.nodes)
        ]


class DeepSpeedNoSsh(Launcher):
    """The DeepSpeed launcher once per node over a shared hostfile: ``--no_ssh --node_rank r`` (what a
    scheduler that starts one task per node does, e.g. ``srun`` in ``configs/launch/pretrain.sbatch``)."""

    name = "deepspeed --no_ssh"

    def __init__(self, hostfile: Path, nodes: int, procs_per_node: int):
        self.hostfile = write_hostfile(hostfile, nodes, procs_per_node)
        self.nodes = nodes
        self.procs_per_node = procs_per_node

    def commands(self, config: Path, overrides: list[str], port: int) -> list[list[str]]:
        return [
            [
                venv_tool("deepspeed"),
                "--hostfile",
                str(self.hostfile),
                "--no_ssh",
                "--node_rank",
                str(rank),
                "--master_addr",
                LOOPBACK_HOSTS[0],
                "--master_port",
                str(port),
                *pretrain_args(config, overrides),
            ]
            for rank in range(self.nodes)
        ]


class DeepSpeedSsh(Launcher):
    """The DeepSpeed launcher's default path: one command on the first host, which reaches every host
    of the hostfile through pdsh and ssh (here an sshd on loopback, see :mod:`trilm.testing.cluster.sshd`).

    Processes started over ssh do not inherit the launcher's environment; DeepSpeed passes on the
    variables listed in its ``.deepspeed_env`` file (``DS_ENV_FILE``), which carries the thread count,
    the node's process tag (pdsh replaces ``%n`` with the node's rank) and the CPU code path
    (:data:`NUMERICS_VARS`)."""

    name = "deepspeed (pdsh/ssh)"

    def __init__(self, hostfile: Path, nodes: int, procs_per_node: int, ssh_env: dict[str, str]):
        self.hostfile = write_hostfile(hostfile, nodes, procs_per_node)
        self.env_file = hostfile.with_name(f"{hostfile.name}.deepspeed_env")
        self.nodes = nodes
        self.procs_per_node = procs_per_node
        self.ssh_env = ssh_env

    def commands(self, config: Path, overrides: list[str], port: int) -> list[list[str]]:
        return [
            [
                venv_tool("deepspeed"),
                "--hostfile",
                str(self.hostfile),
                "--master_addr",
                LOOPBACK_HOSTS[0],
                "--master_port",
                str(port),
                *pretrain_args(config, overrides),
            ]
        ]

    def start(
        self,
        processes: ProcessSet,
        config: Path,
        label: str,
        overrides: list[str] | None = None,
        port: int | None = None,
    ) -> list[Launched]:
        lines = ["OMP_NUM_THREADS=1", f"{TAG_VAR}={processes.tag(label + '-node%n')}"]
        lines += [f"{k}={os.environ[k]}" for k in NUMERICS_VARS if k in os.environ]
        self.env_file.write_text("\n".join(lines) + "\n")
        env = node_env({**self.ssh_env, "DS_ENV_FILE": str(self.env_file)})
        (cmd,) = self.commands(config, overrides or [], free_port() if port is None else port)
        return [processes.start(f"{label}-launcher", cmd, env=env, cwd=ROOT)]


BIND_FAILURE = re.compile(r"EADDRINUSE|address already in use", re.IGNORECASE)
"""What a node's log shows when its rendezvous port was taken between :func:`free_port` and the bind: the
port is found free, closed, and only then handed to the launcher, so any other socket on the machine can
take it in between."""

BIND_RETRIES = 3


class NodeFailed(RuntimeError):
    """A node exited with an error while its peers were still running (typically waiting in the
    rendezvous, which would otherwise hold the launch for its whole timeout)."""

    def __init__(self, node: Launched, code: int, others: list[Launched]):
        self.node = node
        self.code = code
        tails = "\n".join(other.tail(1500) for other in others)
        super().__init__(
            f"{node.name} exited {code} while the other nodes were still running; they were killed.\n"
            f"log: {node.log}\n{node.tail()}\n{tails}"
        )


class Launch:
    """One launch's nodes, polled together so that a failing node ends the launch at once.

    Without this a node lost before the rendezvous (killed, or unable to bind its port) leaves its peers
    waiting for the rendezvous timeout (15 minutes for torchrun). A bind failure is not the run's fault:
    the nodes are started again on another port, up to ``retries`` times; any other failure while a peer
    is still running kills the peers and raises :class:`NodeFailed` with the node's log."""

    def __init__(
        self,
        processes: ProcessSet,
        launcher: Launcher,
        config: Path,
        label: str,
        overrides: list[str] | None = None,
        retries: int = BIND_RETRIES,
    ):
        self.processes = processes
        self.launcher = launcher
        self.config = config
        self.label = label
        self.overrides = overrides or []
        self.retries = retries
        self.ports: list[int] = []
        self.nodes: list[Launched] = []
        self._start()

    def _start(self) -> None:
        port = free_port()
        self.ports.append(port)
        self._log_offsets = {log: log.stat().st_size for log in self.processes.log_dir.glob("*.log")}
        self.nodes = self.launcher.start(self.processes, self.config, self.label, self.overrides, port)

    def _new_output(self, node: Launched) -> str:
        """What ``node`` logged in this attempt (a relaunch appends to the same log)."""
        return node.output()[self._log_offsets.get(node.log, 0) :]

    def poll(self) -> list[int | None]:
        """Every node's exit status so far (None: running). Relaunches on a bind failure; raises
        :class:`NodeFailed` if a node failed while another still runs."""
        codes = [node.returncode for node in self.nodes]
        failed = [(node, code) for node, code in zip(self.nodes, codes, strict=True) if code not in (None, 0)]
        if not failed:
            return codes
        bind_failure = any(BIND_FAILURE.search(self._new_output(node)) for node, _ in failed)
        if bind_failure and len(self.ports) <= self.retries:
            for node in self.nodes:
                node.kill()
            self._start()
            return [None] * len(self.nodes)
        if any(code is None for code in codes):
            node, code = failed[0]
            others = [other for other in self.nodes if other is not node]
            for other in others:
                other.kill()
            raise NodeFailed(node, code, others)
        return codes

    def wait(self, timeout: float, poll: float = 0.05) -> list[int]:
        """Every node's exit status; kills them all and raises TimeoutError if one still runs after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        codes = self.poll()
        while any(code is None for code in codes):
            if time.monotonic() > deadline:
                tails = "\n".join(node.tail() for node in self.nodes)
                for node in self.nodes:
                    node.kill()
                raise TimeoutError(f"still running after {timeout:.0f}s:\n{tails}")
            time.sleep(poll)
            codes = self.poll()
        return [code for code in codes if code is not None]
