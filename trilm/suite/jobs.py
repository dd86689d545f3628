"""Several local runs at once, each in its own ``trilm train`` process with its own share of the cores.

Tiny models do not use two cores well from one process: their matrices are too small to split, and on a
busy machine a second OpenMP thread mostly spins while it waits for the first. Measured with
``benchmarks/batch_throughput.py`` on the 2-core machine under load, one step of the 64-wide model took 32 ms
of CPU time on one thread and 252 ms on two. So a CPU suite trains faster as N single-threaded runs side by
side than as one run after another on all cores; ``trilm suite launch --local --jobs N`` (and the
quickstart, which uses every core this way) does that.

Each run's output goes to ``<run_dir>/train.log``; a run that fails gets ``FAILED`` with the end of that log,
and the others go on. Ctrl-C stops every child (their newest complete state is what a relaunch resumes).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from trilm.suite.config import SuiteRun
from trilm.suite.status import FAILED, run_status

POLL_S = 0.5


def threads_per_job(jobs: int) -> int:
    return max(1, (os.cpu_count() or 1) // jobs)


def _command(config: Path) -> list[str]:
    return [sys.executable, "-m", "trilm.cli", "train", "--config", str(config), "log.progress=false"]


def _tail(path: Path, lines: int = 30) -> str:
    if not path.is_file():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def run_concurrently(
    todo: list[tuple[SuiteRun, Path, str]],
    jobs: int,
    echo: Callable[[str], None] = print,
) -> dict[str, tuple[str, str]]:
    """Train ``(run, config, resume detail)`` items, ``jobs`` at a time; run name → (action, detail)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads_per_job(jobs)), "TOKENIZERS_PARALLELISM": "false"}
    queue = list(todo)
    live: dict[str, tuple[subprocess.Popen, SuiteRun, str, float]] = {}
    results: dict[str, tuple[str, str]] = {}
    try:
        while queue or live:
            while queue and len(live) < jobs:
                run, config, detail = queue.pop(0)
                run.run_dir.mkdir(parents=True, exist_ok=True)
                (run.run_dir / FAILED).unlink(missing_ok=True)
                with (run.run_dir / "train.log").open("a") as log:
                    proc = subprocess.Popen(_command(config), stdout=log, stderr=subprocess.STDOUT, env=env)
                live[run.name] = (proc, run, detail, time.perf_counter())
                echo(f"  started {run.name} ({detail}; {env['OMP_NUM_THREADS']} thread(s))")
            for name, (proc, run, detail, start) in list(live.items()):
                if proc.poll() is None:
                    continue
                del live[name]
                seconds = time.perf_counter() - start
                action = "resumed" if detail.startswith("resumes") else "trained"
                if proc.returncode == 0:
                    status = run_status(run)
                    loss = f", val loss {status.val_loss:.4f}" if status.val_loss is not None else ""
                    results[name] = (action, f"{run.cfg.steps:,} steps{loss}, {seconds:.0f}s")
                else:
                    message = f"trilm train exited with status {proc.returncode}"
                    log = run.run_dir / "train.log"
                    (run.run_dir / FAILED).write_text(f"{_tail(log)}\n\n{message} (log: {log})\n")
                    results[name] = ("failed", f"{message}; see {log}")
                echo(f"  {name}: {results[name][0]}: {results[name][1]}")
            if live:
                time.sleep(POLL_S)
    except KeyboardInterrupt:
        for proc, *_ in live.values():
            proc.terminate()
        for proc, *_ in live.values():
            proc.wait()
        raise
    return results
