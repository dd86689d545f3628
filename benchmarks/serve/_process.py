"""``trilm serve`` as a child process on a free loopback port, for the benchmarks that talk to the real
command over HTTP (:mod:`benchmarks.serve.load`, :mod:`experiments.posthoc_real.serve_chat`).

The port is picked by binding port 0, so several servers can run side by side; readiness is the server's own
``/health``; it is stopped with SIGINT, the path a person's Ctrl-C takes, so its shutdown is exercised too.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from benchmarks.common import CHECKOUT


class Server:
    """One ``trilm serve --model MODEL OPTIONS…`` bound to 127.0.0.1; stderr (and stdout) go to ``log``."""

    def __init__(self, model: Path, options: list[str], log: Path, env: dict[str, str] | None = None):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "trilm.cli", "serve", "--model", str(model), "--host", "127.0.0.1"]
        self.command = [*cmd, "--port", str(self.port), *options]
        self.log = log
        with log.open("w") as fh:
            self.proc = subprocess.Popen(
                self.command, stdout=fh, stderr=subprocess.STDOUT, cwd=CHECKOUT, env=env
            )

    def wait_ready(self, timeout: float = 600) -> None:
        """Return once ``/health`` answers 200; raise with the server's log if it exits or never answers."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"trilm serve exited with {self.proc.returncode}: {self.log.read_text()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"trilm serve did not come up in {timeout} s: {self.log.read_text()[-2000:]}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
