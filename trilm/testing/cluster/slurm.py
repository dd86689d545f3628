"""A real SLURM on one machine: Debian's ``slurm-wlm`` daemons with the nodes on loopback addresses.

``munged`` (its own key and socket), ``slurmctld``, one ``slurmd`` per node (``n1`` on 127.0.0.1, ``n2``
on 127.0.0.2, …, each on its own port), and — when MariaDB and ``slurmdbd`` are installed — accounting
through a private ``mariadbd`` (unix socket only, no network port), so ``sacct`` answers as on a
cluster. No cgroups (``proctrack/linuxproc``, ``task/none``) and no GPUs (no GRES). Everything —
configuration, state, spool, logs, key, sockets, database — lives in one fresh directory, and every
daemon and job carries the :class:`ProcessSet`'s tag, so closing the set ends them all.

Jobs run as the submitting user; slurmd needs root for that, hence :func:`missing` reports a non-root
user as a reason to skip.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from trilm.testing.cluster import free_port
from trilm.testing.cluster.launchers import LOOPBACK_HOSTS
from trilm.testing.cluster.processes import ProcessSet, signal_tagged

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo", "srun")
ACCOUNTING = ("slurmdbd", "sacctmgr", "sacct", "mariadbd", "mariadb-install-db")
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"}


def _find(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(Path(d) / name) for d in ("/usr/sbin", "/sbin") if (Path(d) / name).is_file()), None
    )


def _which(name: str) -> str:
    """The path of a program the cluster starts; :func:`missing` has told the caller which are absent."""
    found = _find(name)
    if found is None:
        raise FileNotFoundError(f"{name}: not installed (see trilm.testing.cluster.slurm.missing())")
    return found


def missing() -> list[str]:
    """Why a loopback SLURM cannot start here (empty when it can)."""
    absent = [name for name in BINARIES if not _find(name)]
    reasons = [f"{', '.join(absent)} not installed (Debian: slurm-wlm, munge)"] if absent else []
    if os.geteuid() != 0:
        reasons.append("slurmd runs jobs as their submitter only when it runs as root")
    return reasons


def has_accounting() -> bool:
    """slurmdbd and MariaDB are installed: ``sacct`` can be answered."""
    return all(_find(name) for name in ACCOUNTING)


@dataclasses.dataclass
class JobState:
    job: str
    """``123`` or, for an array task, ``123_4``."""
    state: str
    exit_code: str
    nodes: str


class LoopbackSlurm:
    """A SLURM cluster of ``nodes`` loopback nodes; :attr:`env` (``SLURM_CONF``) reaches it."""

    def __init__(self, processes: ProcessSet, nodes: int = 2, cpus_per_node: int = 4, name: str = "trilm"):
        self.processes = processes
        self.nodes = [f"n{i + 1}" for i in range(nodes)]
        self.cpus = cpus_per_node
        self.cluster = name
        # munged wants every directory above its socket traversable by all; pytest's tmp dirs are not.
        self.root = Path(tempfile.mkdtemp(prefix="trilm-slurm-"))
        self.root.chmod(0o755)
        self.conf = self.root / "slurm.conf"
        self.log = self.root / "log"
        self.accounting = has_accounting()

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def _daemon_env(self) -> dict[str, str]:
        return {**self.env, "MYSQL_UNIX_PORT": str(self.root / "db" / "mysqld.sock")}

    def _run(self, cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            cmd, env={**os.environ, **self.env}, capture_output=True, text=True, timeout=timeout
        )

    # ---- start --------------------------------------------------------------------------------------
    def _start_munge(self) -> None:
        keys = self.root / "munge"
        keys.mkdir(mode=0o700)
        key = keys / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = self.root / "munge.socket"
        self.processes.start(
            "munged",
            [
                _which("munged"),
                "--foreground",
                f"--key-file={key}",
                f"--socket={self.munge_socket}",
                f"--pid-file={keys / 'munged.pid'}",
                f"--log-file={keys / 'munged.log'}",
                f"--seed-file={keys / 'munged.seed'}",
            ],
        )
        self._wait(lambda: self.munge_socket.exists(), "munged", 30)

    def _start_database(self) -> int:
        """A private mariadbd (socket only) and slurmdbd over it; returns slurmdbd's port."""
        db = self.root / "db"
        db.mkdir()
        install = subprocess.run(
            [
                _which("mariadb-install-db"),
                "--no-defaults",
                f"--datadir={db / 'data'}",
                "--user=root",
                "--skip-test-db",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if install.returncode:
            raise RuntimeError(f"mariadb-install-db failed: {install.stdout[-2000:]}{install.stderr[-2000:]}")
        self.processes.start(
            "mariadbd",
            [
                _which("mariadbd"),
                "--no-defaults",
                f"--datadir={db / 'data'}",
                "--user=root",
                "--skip-networking",
                f"--socket={db / 'mysqld.sock'}",
                f"--pid-file={db / 'mariadbd.pid'}",
                f"--log-error={db / 'mariadbd.err'}",
                "--innodb-buffer-pool-size=16M",
            ],
        )
        self._wait(lambda: (db / "mysqld.sock").exists(), "mariadbd", 60)
        port = free_port()
        dbd_conf = self.root / "slurmdbd.conf"
        dbd_conf.write_text(
            f"AuthType=auth/munge\nAuthInfo=socket={self.munge_socket}\nDbdHost=localhost\n"
            f"DbdAddr=127.0.0.1\nDbdPort={port}\nSlurmUser=root\nLogFile={self.log / 'slurmdbd.log'}\n"
            f"PidFile={self.root / 'slurmdbd.pid'}\nStorageType=accounting_storage/mysql\n"
            "StorageHost=localhost\nStorageUser=root\nStorageLoc=slurm_acct_db\n"
        )
        dbd_conf.chmod(0o600)  # slurmdbd refuses a configuration others can read (it may hold a password)
        self.processes.start("slurmdbd", [_which("slurmdbd"), "-D"], env=self._daemon_env())
        self._wait(lambda: _port_open(port), "slurmdbd", 60)
        return port

    def _write_conf(self, dbd_port: int | None) -> None:
        hostname = socket.gethostname()
        lines = [
            f"ClusterName={self.cluster}",
            f"SlurmctldHost={hostname}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool' / '%n'}",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={self.log / 'slurmctld.log'}",
            f"SlurmdLogFile={self.log / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "MinJobAge=3600",
            "KillWait=5",
            "SlurmdParameters=config_overrides",
            "MailProg=/bin/true",
        ]
        if dbd_port is None:
            lines += [
                "AccountingStorageType=accounting_storage/none",
                "JobAcctGatherType=jobacct_gather/none",
            ]
        else:
            lines += [
                "AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=127.0.0.1",
                f"AccountingStoragePort={dbd_port}",
                f"AccountingStoragePass={self.munge_socket}",
                "JobAcctGatherType=jobacct_gather/linux",
            ]
        for node, addr in zip(self.nodes, LOOPBACK_HOSTS, strict=False):
            lines.append(
                f"NodeName={node} NodeAddr={addr} NodeHostname={hostname} Port={free_port()} "
                f"CPUs={self.cpus} RealMemory=1000 State=UNKNOWN"
            )
        lines.append("PartitionName=loopback Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")

    def start(self, timeout: float = 120.0) -> LoopbackSlurm:
        """Start every daemon and wait until all nodes are idle."""
        for sub in ("state", "log", *(f"spool/{n}" for n in self.nodes)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._start_munge()
        dbd_port = self._start_database() if self.accounting else None
        self._write_conf(dbd_port)
        if dbd_port is not None:
            done = self._run(["sacctmgr", "-i", "add", "cluster", self.cluster])
            if done.returncode:
                raise RuntimeError(f"sacctmgr add cluster failed: {done.stdout}{done.stderr}")
        self.processes.start("slurmctld", [_which("slurmctld"), "-D"], env=self._daemon_env())
        for node in self.nodes:
            self.processes.start(f"slurmd-{node}", [_which("slurmd"), "-D", "-N", node], env=self.env)
        self._wait(self._all_idle, "the nodes to come up idle", timeout)
        return self

    def _all_idle(self) -> bool:
        done = self._run(["sinfo", "-h", "-N", "-o", "%N %T"])
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return done.returncode == 0 and all(states.get(n) == "idle" for n in self.nodes)

    def _wait(self, ready, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [p for p in self.processes.launched if p.returncode is not None]
            if dead or time.monotonic() > deadline:
                detail = "\n".join(p.tail(1500) for p in dead) or self.logs()
                raise RuntimeError(f"loopback SLURM: timed out or failed waiting for {what}\n{detail}")
            time.sleep(0.2)

    def logs(self, chars: int = 2000) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in sorted(self.log.glob("*.log"))
        )

    # ---- jobs ---------------------------------------------------------------------------------------
    def sbatch(self, args: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> str:
        """Submit; returns the job id. The job inherits ``env`` (plus the set's tag), as ``sbatch`` does."""
        cmd = ["sbatch", "--parsable", *args]
        done = subprocess.run(
            cmd,
            env=self.processes.env_for("jobs", {**(env or {}), **self.env}),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()}")
        return done.stdout.strip().split(";")[0]

    def submit_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment to run a submitting command (``trilm suite launch --slurm``) with."""
        return self.processes.env_for("jobs", {**(extra or {}), **self.env})

    def queue(self, jobs: list[str]) -> dict[str, str]:
        """``squeue`` for these jobs (array tasks one by one): {job or job_task: state}."""
        done = self._run(["squeue", "-h", "-r", "-j", ",".join(jobs), "-o", "%i %T"])
        return dict(line.split() for line in done.stdout.splitlines() if len(line.split()) == 2)

    def wait(self, jobs: list[str], timeout: float, poll: float = 1.0) -> dict[str, JobState]:
        """Wait until ``squeue`` no longer lists the jobs, then their final states."""
        deadline = time.monotonic() + timeout
        while self.queue(jobs):
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs {jobs} still queued after {timeout:.0f}s: {self.queue(jobs)}")
            time.sleep(poll)
        return self.final_states(jobs)

    def final_states(self, jobs: list[str]) -> dict[str, JobState]:
        """Per job (array tasks expanded): state and exit code, from ``sacct`` when accounting runs (the
        record can take a moment to arrive), else from ``scontrol show job``."""
        if not self.accounting:
            return self._scontrol_states(jobs)
        for _ in range(50):
            done = self._run(
                ["sacct", "-X", "-n", "-P", "-j", ",".join(jobs), "-o", "JobID,State,ExitCode,NodeList"]
            )
            states = {}
            for line in done.stdout.splitlines():
                job, state, code, nodes = line.split("|")
                states[job] = JobState(job, state.split()[0], code, nodes)
            if states and not any(s.state in ACTIVE for s in states.values()):
                return states
            time.sleep(0.2)
        raise RuntimeError(f"sacct has no final state for {jobs}: {done.stdout}{done.stderr}")

    def _scontrol_states(self, jobs: list[str]) -> dict[str, JobState]:
        states = {}
        for job in jobs:
            done = self._run(["scontrol", "-o", "show", "job", job])
            for line in done.stdout.splitlines():
                fields = dict(re.findall(r"(\w+)=(\S*)", line))
                array = fields.get("ArrayTaskId")
                name = f"{fields['ArrayJobId']}_{array}" if array and array != "N/A" else fields["JobId"]
                states[name] = JobState(
                    name, fields["JobState"], fields["ExitCode"], fields.get("NodeList", "")
                )
        return states

    def kill_jobs_on(self, node: str, sig: int = signal.SIGKILL) -> list[int]:
        """Signal every job process running on ``node`` at once (its training processes, as if the node
        died under them; the daemons stay up); returns the pids signalled."""
        return signal_tagged(self.processes.tag("jobs"), sig, where={"SLURMD_NODENAME": node})

    def scancel(self, job: str) -> float:
        """Cancel a job (or ``job_task``); returns the time it was sent."""
        sent = time.monotonic()
        done = self._run(["scancel", job])
        if done.returncode:
            raise RuntimeError(f"scancel {job} failed: {done.stderr.strip()}")
        return sent

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0
