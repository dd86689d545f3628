"""Several local runs at once: N single-threaded worker processes, each training its share of the runs.

Tiny models do not use two cores well from one process: their matrices are too small to split, and on a
busy machine a second OpenMP thread mostly spins while it waits for the first. Measured with
``benchmarks/train/batch_throughput.py`` on the 2-core machine under load, one step of the 64-wide model took
84 ms of wall time on one thread and 458 ms on two. So a CPU suite trains faster as N single-threaded runs
side by side than as one run after another on all cores; ``trilm suite launch --local --jobs N`` (and the
quickstart, which uses every core this way) does that.

Each worker is one ``python -m trilm.suite.jobs`` process that trains its runs one after another in
process, so torch and DeepSpeed are imported once per worker, not once per run (about 4.5 CPU-seconds each).
Runs are dealt to workers largest first, each to the least loaded (by training FLOPs). A run's output goes
to ``<run_dir>/train.log``; a run that fails gets ``FAILED`` with its traceback, and its worker goes on with
the next. Ctrl-C stops every worker (their newest complete state is what a relaunch resumes).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

from trilm.atomic import write_text
from trilm.model.flops import flops_per_token
from trilm.parallel import shutdown_parallel
from trilm.suite.config import SuiteRun
from trilm.suite.status import FAILED, run_status
from trilm.train.config import TrainConfig

POLL_S = 0.5


def threads_per_job(jobs: int) -> int:
    return max(1, (os.cpu_count() or 1) // jobs)


def deal(costs: list[float], jobs: int) -> list[list[int]]:
    """Indices of ``costs`` dealt to ``jobs`` workers: largest first, each to the least loaded worker."""
    shares: list[list[int]] = [[] for _ in range(jobs)]
    load = [0.0] * jobs
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        w = min(range(jobs), key=lambda w: load[w])
        shares[w].append(i)
        load[w] += costs[i]
    return [sorted(s) for s in shares if s]


def _cost(run: SuiteRun) -> float:

    return flops_per_token(run.cfg.model, run.cfg.sequence_length) * run.cfg.steps * run.cfg.batch_tokens


def run_concurrently(
    todo: list[tuple[SuiteRun, Path, str]],
    jobs: int,
    echo: Callable[[str], None] = print,
) -> dict[str, tuple[str, str]]:
    """Train ``(run, config, resume detail)`` items on ``jobs`` workers; run name → (action, detail)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads_per_job(jobs)), "TOKENIZERS_PARALLELISM": "false"}
    shares = deal([_cost(run) for run, _, _ in todo], jobs)
    for run, _, _ in todo:  # a FAILED left by an earlier launch must not read as this one's
        (run.run_dir / FAILED).unlink(missing_ok=True)
    workers = []
    for share in shares:
        configs = [str(todo[i][1]) for i in share]
        proc = subprocess.Popen([sys.executable, "-m", "trilm.suite.jobs", *configs], env=env)
        workers.append((proc, [todo[i] for i in share]))
    echo(f"  {len(workers)} worker(s), {env['OMP_NUM_THREADS']} thread(s) each")
    results: dict[str, tuple[str, str]] = {}
    start = time.perf_counter()
    try:
        while True:
            alive = [p for p, _ in workers if p.poll() is None]
            for proc, items in workers:
                for run, _, detail in items:
                    if run.name not in results and _settled(run, proc):
                        results[run.name] = _outcome(run, detail, proc, time.perf_counter() - start)
                        echo(f"  {run.name}: {results[run.name][0]}: {results[run.name][1]}")
            if not alive:
                break
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        for proc, _ in workers:
            proc.terminate()
        for proc, _ in workers:
            proc.wait()
        raise
    return results


def _settled(run: SuiteRun, proc: subprocess.Popen) -> bool:
    if proc.poll() is not None:
        return True
    if (run.run_dir / FAILED).exists():
        return True
    return run_status(run).state == "finished"


def _outcome(run: SuiteRun, detail: str, proc: subprocess.Popen, seconds: float) -> tuple[str, str]:
    status = run_status(run)
    action = "resumed" if detail.startswith("resumes") else "trained"
    if status.state == "finished":
        loss = f", val loss {status.val_loss:.4f}" if status.val_loss is not None else ""
        return action, f"{run.cfg.steps:,} steps{loss}, done after {seconds:.0f}s"
    log = run.run_dir / "train.log"
    if (run.run_dir / FAILED).exists():
        last = (run.run_dir / FAILED).read_text().strip().splitlines()[-1:]
        return "failed", f"{last[0] if last else 'failed'} (see {log})"
    message = f"its worker exited with status {proc.returncode} before the run finished"
    run.run_dir.mkdir(parents=True, exist_ok=True)
    write_text(run.run_dir / FAILED, f"{message} (log: {log})\n")
    return "failed", f"{message}; see {log}"


# ---- the worker ----------------------------------------------------------------------------------------
@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """Send this process's stdout and stderr (file descriptors included) to ``path`` for a while."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with path.open("a") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def train_configs(configs: list[str]) -> int:
    """Train each resolved run config in turn, in this process; a failure is recorded and the next starts."""
    # deferred for start-up time: loads megatron only when called
    from trilm.train.trainer import Trainer

    failed = 0
    for config in configs:
        cfg = TrainConfig.from_yaml(config).with_overrides(["log.progress=false"])
        run_dir = Path(cfg.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / FAILED).unlink(missing_ok=True)
        with _output_to(run_dir / "train.log"):
            try:
                summary = Trainer(cfg).fit()
                print(
                    json.dumps(
                        {"run": run_dir.name, "steps": summary.steps, "final_loss": summary.final_loss}
                    )
                )
            except Exception as exc:  # one failing run must not stop the others; it is recorded
                failed += 1
                text = traceback.format_exc()
                print(text, file=sys.stderr)
                write_text(run_dir / FAILED, f"{text}\n{type(exc).__name__}: {exc}\n")
            finally:
                shutdown_parallel()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(train_configs(sys.argv[1:]))
