"""Process trees that a test can signal and end as a whole, even after their parents are gone.

Multi-node tests start launchers (torchrun, the DeepSpeed launcher, sshd, SLURM daemons) that start
workers of their own, and then kill some of them on purpose. Neither the process group nor the parent
chain finds everything afterwards: torchrun puts each worker in a new session, SLURM forks job steps out
of its daemons, and a killed parent hands its children to init. The environment does: every process
inherits its parent's, so a tag variable set on the first process marks all of its descendants (a
launcher that builds a clean environment, like an ssh login, has to pass the tag on explicitly).

A tag is ``<set>:<name>``: one :class:`ProcessSet` per test, one name per "node" or daemon. Signalling a
name reaches everything that node started; closing the set ends every process carrying its prefix, so no
test leaves an orphan behind whatever failed. A few programs overwrite their environment block to show a
status in ``ps`` (sshd does), which hides the tag: signals therefore also go to the live descendants of
every command the set started, found through their parent links.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

TAG_VAR = "TRILM_PROCESS_TAG"


def tagged_pids(prefix: str, where: dict[str, str] | None = None) -> list[int]:
    """Pids of live processes (zombies excluded) whose ``TRILM_PROCESS_TAG`` starts with ``prefix`` and
    whose environment also has every ``where`` variable at its value (e.g. ``SLURMD_NODENAME=n2``: the
    processes of a job on one SLURM node)."""
    needle = f"{TAG_VAR}={prefix}".encode()
    wanted = {f"{k}={v}".encode() for k, v in (where or {}).items()}
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                environ = fh.read().split(b"\0")
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and any(var.startswith(needle) for var in environ) and wanted <= set(environ):
            found.append(int(entry.name))
    return found


def signal_tagged(prefix: str, sig: int, where: dict[str, str] | None = None) -> list[int]:
    """Send ``sig`` to every process :func:`tagged_pids` finds; returns the pids signalled."""
    pids = tagged_pids(prefix, where)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return pids


def process_tree(root: int) -> list[int]:
    """``root`` and its live descendants (by parent pid), parents first."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def kill_tagged(prefix: str, within: float = 30.0) -> None:
    """SIGKILL every process tagged with ``prefix``, again until none is left (a launcher may start a
    worker between two sweeps); raises if some survive ``within`` seconds."""
    deadline = time.monotonic() + within
    while signal_tagged(prefix, signal.SIGKILL):
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes tagged {prefix!r} survived SIGKILL: {tagged_pids(prefix)}")
        time.sleep(0.05)


class Launched:
    """One started command: its tag, its output file, when it started and how it ended."""

    def __init__(self, name: str, tag: str, cmd: Sequence[str], proc: subprocess.Popen, log: Path):
        self.name = name
        self.tag = tag
        self.cmd = list(cmd)
        self.proc = proc
        self.log = log
        self.started = time.monotonic()
        self.ended: float | None = None

    @property
    def returncode(self) -> int | None:
        code = self.proc.poll()
        if code is not None and self.ended is None:
            self.ended = time.monotonic()
        return code

    def wait(self, timeout: float) -> int | None:
        """The exit status, or None if it is still running after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.returncode is None:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)
        return self.returncode

    def signal(self, sig: int) -> list[int]:
        """Signal the whole tree (the command and all it started); returns the pids signalled."""
        pids = process_tree(self.proc.pid) if self.proc.poll() is None else []  # not yet reaped: still ours
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return sorted(set(pids) | set(signal_tagged(self.tag, sig)))

    def kill(self) -> float:
        """SIGKILL the whole tree at once, like a node losing power; returns the time it was sent."""
        sent = time.monotonic()
        self.signal(signal.SIGKILL)
        kill_tagged(self.tag)
        self.wait(30)
        return sent

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, chars: int = 4000) -> str:
        return f"--- {self.name}: {' '.join(self.cmd)}\n{self.output()[-chars:]}"


class ProcessSet:
    """Start tagged commands; on close, end every process any of them started (``with`` block)."""

    def __init__(self, log_dir: Path, env: dict[str, str] | None = None):
        self.prefix = f"{uuid.uuid4().hex[:12]}:"
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ if env is None else env)
        self.launched: list[Launched] = []

    def tag(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def env_for(self, name: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a command named ``name`` (also for commands started elsewhere: sbatch)."""
        return {**self.env, **(extra or {}), TAG_VAR: self.tag(name)}

    def start(
        self,
        name: str,
        cmd: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> Launched:
        log = self.log_dir / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                list(cmd),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env_for(name, env),
                cwd=cwd,
                start_new_session=True,
            )
        launched = Launched(name, self.tag(name), cmd, proc, log)
        self.launched.append(launched)
        return launched

    def run(self, name: str, cmd: Sequence[str], *, timeout: float, **kwargs) -> tuple[int, str]:
        """Start ``cmd`` and wait for it; (exit status, output). Raises TimeoutError (tree killed) if late."""
        launched = self.start(name, cmd, **kwargs)
        code = launched.wait(timeout)
        if code is None:
            launched.kill()
            raise TimeoutError(f"{' '.join(cmd)} still running after {timeout:.0f}s:\n{launched.tail()}")
        return code, launched.output()

    def close(self) -> None:
        for launched in self.launched:
            launched.signal(signal.SIGKILL)
        kill_tagged(self.prefix)
        for launched in self.launched:
            launched.wait(10)

    def __enter__(self) -> ProcessSet:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
