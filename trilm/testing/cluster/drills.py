"""Multi-node drills, shared by the tests and ``benchmarks/train/multinode.py``: a run to the end, a node
killed mid-run and the relaunch that resumes it, and the comparison of two run directories.

What a drill measures is what an operator sees: how long the surviving node takes to exit after its
peer died, with which status, what the run directory holds at that moment (complete states, and any
checkpoint directory left half-written), and from which step the relaunch resumed.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file

from trilm.store.integrity import complete_steps
from trilm.store.layout import step_dir_name
from trilm.testing.cluster.launchers import PRETRAIN, ROOT, Launch, Launcher, node_env, venv_tool
from trilm.testing.cluster.processes import Launched, ProcessSet
from trilm.train.checkpoint import RunDir
from trilm.train.config import TrainConfig


# ---- reading a run directory ------------------------------------------------------------------------
def _records(path: Path) -> list[dict]:
    """Complete JSON lines of a log that may be being written right now (a torn last line is left out)."""
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]
    return [json.loads(line) for line in lines if line.strip()]


def logged_losses(run_dir: Path) -> dict[int, float]:
    """Training loss per step; a step logged again after a resume keeps its last value."""
    return {r["step"]: r["loss"] for r in _records(Path(run_dir) / "logs/metrics.jsonl") if "loss" in r}


def validation_losses(run_dir: Path) -> dict[int, float]:
    return {
        r["step"]: r["val_loss"] for r in _records(Path(run_dir) / "logs/metrics.jsonl") if "val_loss" in r
    }


def last_logged_step(run_dir: Path) -> int:
    return max(logged_losses(run_dir), default=0)


def events(run_dir: Path, name: str) -> list[dict]:
    return [e for e in _records(Path(run_dir) / "logs/events.jsonl") if e["event"] == name]


def state_save_started(run_dir: Path, step: int) -> bool:
    """The state of ``step`` is being written or has been: its directory exists, final (``step-N``) or
    staged (``.step-N.tmp-HOST-PID``, :func:`trilm.atomic.temp_path`)."""
    state = RunDir(run_dir).state
    name = step_dir_name(step)
    return state.is_dir() and any(p.name == name or p.name.startswith(f".{name}.") for p in state.iterdir())


def unfinished_checkpoints(run_dir: Path) -> list[str]:
    """Checkpoint directories present but not complete (a save cut short): they must never be loaded."""
    run = RunDir(run_dir)
    found = []
    for parent in (run.state, run.snapshots):
        if not parent.is_dir():
            continue
        complete = {path.name for _, path in complete_steps(parent)}
        found += [
            f"{parent.name}/{p.name}"
            for p in sorted(parent.iterdir())
            if p.is_dir() and p.name not in complete
        ]
    return found


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    run = RunDir(run_dir)
    _, path = complete_steps(run.snapshots)[-1]
    return load_file(str(path / "model.safetensors"))


@dataclasses.dataclass
class Comparison:
    """Two runs of the same config: per-step training loss, validation losses, final weights."""

    steps: int
    losses_equal: bool
    max_loss_diff: float
    val_losses_equal: bool
    weights_equal: bool
    max_weight_diff: float

    @property
    def identical(self) -> bool:
        return self.losses_equal and self.val_losses_equal and self.weights_equal


def compare_runs(a: Path, b: Path) -> Comparison:
    la, lb = logged_losses(a), logged_losses(b)
    if sorted(la) != sorted(lb):
        raise AssertionError(f"{a} and {b} logged different steps: {sorted(la)} vs {sorted(lb)}")
    wa, wb = final_weights(a), final_weights(b)
    if wa.keys() != wb.keys():
        raise AssertionError(f"{a} and {b} have different tensors")
    diffs = [float((wa[k].double() - wb[k].double()).abs().max()) for k in wa]
    return Comparison(
        steps=len(la),
        losses_equal=la == lb,
        max_loss_diff=max(abs(la[s] - lb[s]) for s in la),
        val_losses_equal=validation_losses(a) == validation_losses(b),
        weights_equal=all(torch.equal(wa[k], wb[k]) for k in wa),
        max_weight_diff=max(diffs),
    )


# ---- running ---------------------------------------------------------------------------------------
@dataclasses.dataclass
class Outcome:
    """A launch that ran to its end."""

    launcher: str
    commands: list[str]
    codes: list[int]
    seconds: float
    nodes: list[Launched]

    def tail(self, chars: int = 3000) -> str:
        return "\n".join(node.tail(chars) for node in self.nodes)


def _commands(nodes: list[Launched]) -> list[str]:
    return [" ".join(node.cmd) for node in nodes]


def wait_all(nodes: list[Launched], timeout: float) -> list[int]:
    """Every node's exit status; kills them all and raises if one is still running after ``timeout``."""
    deadline = time.monotonic() + timeout
    codes = [node.wait(max(deadline - time.monotonic(), 0.0)) for node in nodes]
    if any(code is None for code in codes):
        tails = "\n".join(node.tail() for node in nodes)
        for node in nodes:
            node.kill()
        raise TimeoutError(f"still running after {timeout:.0f}s:\n{tails}")
    return [code for code in codes if code is not None]


def _exit_code(code: int | None, what: str) -> int:
    if code is None:
        raise TimeoutError(f"{what} was still running when the drill read its exit code")
    return code


def run_to_end(
    processes: ProcessSet,
    launcher: Launcher,
    config: Path,
    label: str,
    timeout: float,
    overrides: list[str] | None = None,
) -> Outcome:
    """Launch and wait for every node; raises :class:`~trilm.testing.cluster.launchers.NodeFailed` as soon
    as one node fails while another still runs (see :class:`~trilm.testing.cluster.launchers.Launch`)."""
    started = time.monotonic()
    launch = Launch(processes, launcher, config, label, overrides)
    codes = launch.wait(timeout)
    nodes = launch.nodes
    return Outcome(launcher.describe(), _commands(nodes), codes, time.monotonic() - started, nodes)


@dataclasses.dataclass
class Failure:
    """One node killed mid-run: what the survivors did and what the run directory held afterwards."""

    launcher: str
    commands: list[str]
    trigger: str
    killed_node: int
    killed_pids: int
    kill_after_s: float
    """Seconds from the launch to the kill."""
    last_logged_step: int
    """The newest step in metrics.jsonl when the kill was sent."""
    survivor_exit_s: float
    """Seconds from the kill until every surviving launcher had exited."""
    survivor_codes: list[int]
    complete_states: list[int]
    unfinished: list[str]
    survivors: list[Launched] = dataclasses.field(repr=False, default_factory=list)


def kill_node_when(
    processes: ProcessSet,
    launcher: Launcher,
    config: Path,
    run_dir: Path,
    label: str,
    when: Callable[[], bool],
    trigger: str,
    *,
    node: int = 1,
    sig: int = signal.SIGKILL,
    timeout: float = 600.0,
    exit_bound: float = 300.0,
    poll: float = 0.002,
) -> Failure:
    """Launch, send ``sig`` to every process of ``node`` as soon as ``when()`` holds (SIGKILL: the node
    died; SIGSTOP: it hangs), and wait for the survivors; a stopped node is killed once they are gone.

    Raises if the run ends before the trigger, or if a survivor is still running ``exit_bound`` seconds
    after the kill (it is then killed too, so nothing is left behind)."""
    started = time.monotonic()
    launch = Launch(processes, launcher, config, label)
    deadline = started + timeout
    while not when():
        if any(code is not None for code in launch.poll()) or time.monotonic() > deadline:
            tails = "\n".join(n.tail() for n in launch.nodes)
            raise RuntimeError(f"{trigger}: never happened (a node ended or {timeout:.0f}s passed)\n{tails}")
        time.sleep(poll)
    nodes = launch.nodes
    sent = time.monotonic()
    logged = last_logged_step(run_dir)
    killed = launcher.kill_node(processes, label, node, sig)
    survivors = [n for n in nodes if n.name != f"{label}-node{node}"]
    codes = wait_all(survivors, exit_bound)
    exited = max((n.ended or time.monotonic() for n in survivors), default=sent)
    if sig != signal.SIGKILL:
        launcher.kill_node(processes, label, node, signal.SIGKILL)
    for n in nodes:
        n.wait(30)
    run = RunDir(run_dir)
    return Failure(
        launcher=launcher.describe(),
        commands=_commands(nodes),
        trigger=trigger,
        killed_node=node,
        killed_pids=len(killed),
        kill_after_s=sent - started,
        last_logged_step=logged,
        survivor_exit_s=exited - sent,
        survivor_codes=codes,
        complete_states=[step for step, _ in complete_steps(run.state)],
        unfinished=unfinished_checkpoints(run_dir),
        survivors=survivors,
    )


def resumed_from(run_dir: Path) -> list[int]:
    """The step of every resume recorded in the run's events, in order."""
    return [e["step"] for e in events(run_dir, "resume")]


# ---- a suite's SLURM array --------------------------------------------------------------------------
@dataclasses.dataclass
class SuiteCancel:
    """A suite submitted as one SLURM array, one task ``scancel``led mid-run, the suite launched again:
    what each command printed, the job states, and where the cancelled run resumed. ``straight`` is the
    cancelled run's config trained without interruption (one process, as in the array task)."""

    commands: list[str]
    outputs: list[str]
    """What each of :attr:`commands` printed."""
    job: str
    runs: list[str]
    array_script: str
    """The array script the first launch submitted (the second one rewrites it for the runs left)."""
    cancelled: str
    last_logged_step: int
    """The cancelled run's newest logged step when ``scancel`` was sent."""
    gone_s: float
    """Seconds from ``scancel`` until ``squeue`` no longer lists the task."""
    states: dict[str, str]
    """Every task of the first array: state and exit code."""
    complete_states: list[int]
    unfinished: list[str]
    status: dict[str, str]
    """``trilm suite status --json``: run → state, after the cancel."""
    resubmitted_job: str
    resubmitted_runs: list[str]
    resubmitted_states: dict[str, str]
    relaunch_s: float
    """Seconds from the second ``trilm suite launch`` until its array left the queue."""
    resumed_from: list[int]
    run_dir: Path
    straight: Path
    straight_code: int


def _suite_cli(cluster, args: list[str], timeout: float) -> tuple[str, str]:
    """``trilm suite ARGS`` as a user submitting to ``cluster`` runs it; returns (command, stdout)."""
    cmd = [sys.executable, "-m", "trilm.cli", "suite", *args]
    done = subprocess.run(
        cmd,
        env=cluster.submit_env(node_env({"DEEPSPEED": venv_tool("deepspeed")})),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode:
        raise RuntimeError(
            f"trilm suite {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
        )
    return "trilm suite " + " ".join(args), done.stdout


def _wait_until(predicate: Callable[[], bool], what: str, timeout: float, poll: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(poll)


def _state_text(states: dict) -> dict[str, str]:
    return {job: f"{s.state} {s.exit_code}" for job, s in sorted(states.items())}


def cancel_suite_run(
    cluster, processes: ProcessSet, suite_file: Path, root: Path, *, after_step: int, timeout: float
) -> SuiteCancel:
    """``trilm suite launch SUITE --slurm`` on ``cluster`` (``root``: the suite's run root); once the first
    run has logged ``after_step`` and written a state, ``scancel`` its array task and wait for the array;
    ``trilm suite status``; launch the suite again (only unfinished runs are resubmitted) and wait. The
    cancelled run's config also trains straight through meanwhile, for the comparison."""
    launch = ["launch", str(suite_file), "--slurm", "--no-progress"]
    commands, outputs = [], []

    def cli(args: list[str]) -> str:
        command, output = _suite_cli(cluster, args, timeout)
        commands.append(command)
        outputs.append(output)
        return output

    cli(launch)
    jobs_file = root / "launch" / "jobs.jsonl"
    first = json.loads(jobs_file.read_text().splitlines()[-1])
    job, runs = first["job"], first["runs"]
    array = max((root / "launch").glob("array-*.sbatch"), key=lambda path: path.stat().st_mtime)
    array_script = array.read_text()
    cancelled = runs[0]
    run_dir = root / cancelled
    straight = root.parent / f"{cancelled}-straight"
    config = TrainConfig.from_yaml(root / "configs" / f"{cancelled}.yaml")
    config.replace(run_dir=str(straight)).to_yaml(straight.with_suffix(".yaml"))
    reference = processes.start(
        "straight",
        [sys.executable, str(PRETRAIN), "--config", str(straight.with_suffix(".yaml"))],
        env=node_env(),
        cwd=ROOT,
    )
    _wait_until(
        lambda: last_logged_step(run_dir) >= after_step and bool(complete_steps(RunDir(run_dir).state)),
        f"{cancelled} never logged step {after_step} with a state written",
        timeout,
    )
    logged = last_logged_step(run_dir)
    task = f"{job}_0"
    sent = cluster.scancel(task)
    _wait_until(lambda: not cluster.queue([task]), f"{task} still queued after scancel", timeout)
    gone = time.monotonic() - sent
    states = cluster.wait([job], timeout=timeout)
    complete = [step for step, _ in complete_steps(RunDir(run_dir).state)]
    unfinished = unfinished_checkpoints(run_dir)
    status = {r["run"]: r["state"] for r in json.loads(cli(["status", str(suite_file), "--json"]))}
    started = time.monotonic()
    cli(launch)
    second = json.loads(jobs_file.read_text().splitlines()[-1])
    again = cluster.wait([second["job"]], timeout=timeout)
    relaunch_s = time.monotonic() - started
    return SuiteCancel(
        commands=commands,
        outputs=outputs,
        job=job,
        runs=runs,
        array_script=array_script,
        cancelled=cancelled,
        last_logged_step=logged,
        gone_s=gone,
        states=_state_text(states),
        complete_states=complete,
        unfinished=unfinished,
        status=status,
        resubmitted_job=second["job"],
        resubmitted_runs=second["runs"],
        resubmitted_states=_state_text(again),
        relaunch_s=relaunch_s,
        resumed_from=resumed_from(run_dir),
        run_dir=run_dir,
        straight=straight,
        straight_code=_exit_code(reference.wait(timeout), "the uninterrupted run"),
    )
