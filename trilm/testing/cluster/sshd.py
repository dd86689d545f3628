"""An sshd on loopback, so the DeepSpeed launcher's default multi-node path (pdsh over ssh) can run on
one machine: passwordless ssh to 127.0.0.1 and 127.0.0.2 with a key made for the occasion.

Nothing outside the working directory is touched except ``/run/sshd``, the privilege-separation
directory sshd insists on when it runs as root (created empty if missing, as Debian's init script does).
The client side is a ``ssh`` wrapper placed first on ``PATH`` that adds ``-F <config>`` (port, key, known
hosts): pdsh and DeepSpeed call plain ``ssh`` and see passwordless access, as on a cluster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from trilm.testing.cluster import free_port
from trilm.testing.cluster.processes import ProcessSet

SSHD = "/usr/sbin/sshd"


def missing() -> list[str]:
    """Programs the loopback sshd needs that are not installed (empty when it can run)."""
    need = {
        "sshd": Path(SSHD).is_file(),
        "ssh": shutil.which("ssh"),
        "ssh-keygen": shutil.which("ssh-keygen"),
    }
    need["pdsh"] = shutil.which("pdsh")
    return [name for name, found in need.items() if not found]


class LoopbackSshd:
    """Start with :meth:`start`; :attr:`env` is the environment under which ``ssh HOST`` just works."""

    def __init__(
        self, processes: ProcessSet, workdir: Path, hosts: tuple[str, ...] = ("127.0.0.1", "127.0.0.2")
    ):
        self.processes = processes
        self.dir = Path(workdir)
        self.hosts = hosts
        self.port = free_port()
        self.client_config = self.dir / "ssh_config"
        self.bin = self.dir / "bin"

    @property
    def env(self) -> dict[str, str]:
        return {"PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}", "PDSH_RCMD_TYPE": "ssh"}

    def _keygen(self, path: Path) -> None:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)

    def _write_configs(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        for key in ("host_key", "client_key"):
            if not (self.dir / key).exists():
                self._keygen(self.dir / key)
        (self.dir / "authorized_keys").write_text((self.dir / "client_key.pub").read_text())
        root_login = "prohibit-password" if os.geteuid() == 0 else "no"
        server = self.dir / "sshd_config"
        server.write_text(
            f"Port {self.port}\n"
            + "".join(f"ListenAddress {host}\n" for host in self.hosts)
            + f"HostKey {self.dir / 'host_key'}\n"
            f"PidFile {self.dir / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {self.dir / 'authorized_keys'}\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            f"PermitRootLogin {root_login}\nStrictModes no\nUsePAM no\nLogLevel ERROR\n"
        )
        self.client_config.write_text(
            f"Host *\n  Port {self.port}\n  IdentityFile {self.dir / 'client_key'}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.dir / 'known_hosts'}\n  StrictHostKeyChecking no\n"
            "  BatchMode yes\n  LogLevel ERROR\n"
        )
        self.bin.mkdir(exist_ok=True)
        wrapper = self.bin / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {self.client_config} "$@"\n')
        wrapper.chmod(0o755)
        return server

    def start(self, timeout: float = 60.0) -> LoopbackSshd:
        """Start sshd and wait until ``ssh HOST true`` succeeds for every host."""
        server = self._write_configs()
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        daemon = self.processes.start("sshd", [SSHD, "-D", "-e", "-f", str(server)])
        env = {**os.environ, **self.env}
        deadline = time.monotonic() + timeout
        for host in self.hosts:
            while True:
                probe = subprocess.run(["ssh", host, "true"], env=env, capture_output=True, text=True)
                if probe.returncode == 0:
                    break
                if daemon.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"sshd on {host}:{self.port} not reachable: {probe.stderr.strip()}\n{daemon.tail()}"
                    )
                time.sleep(0.2)
        return self
