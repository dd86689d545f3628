"""Multi-node drills, shared by the tests and ``benchmarks/multinode.py``: a run to the end, a node killed
mid-run and the relaunch that resumes it, and the comparison of two run directories.

What a drill measures is what an operator sees: how long the surviving node takes to exit after its
peer died, with which status, what the run directory holds at that moment (complete states, and any
checkpoint directory left half-written), and from which step the relaunch resumed.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file

from trilm.testing.launchers import Launcher
from trilm.testing.processes import Launched, ProcessSet
from trilm.train.checkpoint import RunDir, complete_steps


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
    """The state of ``step`` is being written or has been (its directory exists, temporary or final)."""
    state = RunDir(run_dir).state
    return state.is_dir() and any(p.name.endswith(f"step-{step}") for p in state.iterdir())


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
    return codes


def run_to_end(
    processes: ProcessSet,
    launcher: Launcher,
    config: Path,
    label: str,
    timeout: float,
    overrides: list[str] | None = None,
) -> Outcome:
    started = time.monotonic()
    nodes = launcher.start(processes, config, label, overrides)
    codes = wait_all(nodes, timeout)
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
    nodes = launcher.start(processes, config, label)
    deadline = started + timeout
    while not when():
        if any(n.returncode is not None for n in nodes) or time.monotonic() > deadline:
            tails = "\n".join(n.tail() for n in nodes)
            raise RuntimeError(f"{trigger}: never happened (a node ended or {timeout:.0f}s passed)\n{tails}")
        time.sleep(poll)
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
