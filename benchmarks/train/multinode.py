"""Multi-node drills on one machine, for the record: for each launcher the exact commands, their output,
the losses and final weights against the 1-node 4-process run, and the failure timeline (kill → survivor
exit → resume step).

    python -m benchmarks.train.multinode --out benchmarks/results            # every launcher available
    python -m benchmarks.train.multinode --drills torchrun,hang --out /tmp/drills  # a subset

Drills (the run is the multi-node tests' own, ``trilm/testing/cluster/runs.py``: the tiny TriLM at TP 2 × DP 2
under ZeRO-1, 16 steps, on two loopback nodes × two processes, gloo):

- ``torchrun``: ``torchrun --nnodes 2 --node-rank r`` per node; node 1 SIGKILLed after step 6 is logged;
- ``deepspeed``: the DeepSpeed launcher per node, ``--no_ssh --node_rank r``; the same failure;
- ``pdsh``: one ``deepspeed --hostfile`` reaching both hosts through pdsh and an sshd on loopback;
  node 1's processes SIGKILLed;
- ``slurm``: ``configs/launch/pretrain.sbatch`` on a loopback SLURM (2 nodes); node n2's job processes
  SIGKILLed, then resubmitted; and a job ``scancel``led, then resubmitted;
- ``hang``: torchrun with node 1 frozen (SIGSTOP: its connections stay open, as with a hung node or a
  network partition) and ``parallel.collective_timeout=30``: node 0 gives up after the timeout;
- ``suite``: ``trilm suite launch SUITE --slurm`` of a 2-run CPU suite (one array) on the loopback SLURM;
  one array task ``scancel``led once its run logged step 10, the suite launched again: only that run is
  resubmitted, and it resumes; compared with the same run trained without interruption.

Every relaunch is the same command again; its final weights are compared with the 1-node run (the suite's
run with its own uninterrupted run). The JSON (``multinode-loopback-<date>.json``) is rewritten after each
drill, with the machine's load average when the drill started; ``--update`` keeps the drills already in
that day's file and replaces only those run now.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import CHECKOUT, command, today, write_result
from trilm.data.pipeline import prepare_embedded
from trilm.store.integrity import complete_steps
from trilm.testing.cluster import slurm as loopback_slurm
from trilm.testing.cluster import sshd
from trilm.testing.cluster.drills import (
    cancel_suite_run,
    compare_runs,
    kill_node_when,
    last_logged_step,
    resumed_from,
    run_to_end,
    unfinished_checkpoints,
)
from trilm.testing.cluster.launchers import DeepSpeedNoSsh, DeepSpeedSsh, Torchrun, node_env, venv_tool
from trilm.testing.cluster.processes import ProcessSet
from trilm.testing.cluster.runs import LAUNCH_TIMEOUT, multinode_config, slurm_suite
from trilm.train.checkpoint import RunDir

DRILLS = ("torchrun", "deepspeed", "pdsh", "slurm", "hang", "suite")
SUITE_CANCEL_STEP = 10
TRIGGER_STEP = 6


def _tail(text: str, lines: int = 12) -> list[str]:
    kept = [line for line in text.splitlines() if "FutureWarning" not in line and "return func(" not in line]
    return kept[-lines:]


def _key_lines(text: str, limit: int = 8) -> list[str]:
    """What an operator reads first in a failed node's log: trilm's own lines and the errors."""
    keys = ("trilm:", "Error", "error", "FAILED", "exitcode", "exits with return code", "Killing")
    found = []
    for line in text.splitlines():
        line = line.strip()
        if any(k in line for k in keys) and "Warning" not in line and line not in found:
            found.append(line[:400])
    return found[:limit]


def _resume_lines(text: str) -> list[str]:
    """A relaunched run's log, shortened to where it resumed, how it ended and its last lines."""
    lines = [line for line in text.splitlines() if "resum" in line or line.startswith("done:")]
    return lines + [line for line in _tail(text, 3) if line not in lines]


def _compare(reference: Path, run: Path) -> dict:
    return dataclasses.asdict(compare_runs(reference, run))


def _failure_record(failure, run: Path, relaunch, reference: Path) -> dict:
    return {
        "trigger": failure.trigger,
        "signal": "SIGKILL",
        "kill_after_launch_s": round(failure.kill_after_s, 2),
        "last_logged_step_at_kill": failure.last_logged_step,
        "killed_processes": failure.killed_pids,
        "survivor_exit_after_kill_s": round(failure.survivor_exit_s, 2),
        "survivor_exit_codes": failure.survivor_codes,
        "survivor_output": [line for s in failure.survivors for line in _key_lines(s.output())],
        "complete_states_after_failure": failure.complete_states,
        "unfinished_checkpoints_after_failure": failure.unfinished,
        "relaunch_codes": relaunch.codes,
        "relaunch_s": round(relaunch.seconds, 1),
        "resumed_from_step": resumed_from(run)[-1],
        "relaunch_output": _tail(relaunch.tail(), 10),
        "final_equal_to_one_node": _compare(reference, run),
    }


def launcher_drill(name, launcher, processes, data, work: Path, reference: Path) -> dict:
    """Run to the end; then kill node 1 after step 6 is logged and relaunch the same command."""
    run = work / f"{name}-run"
    config = multinode_config(data, run)
    outcome = run_to_end(processes, launcher, config, f"{name}-run", LAUNCH_TIMEOUT)
    record = {
        "launcher": launcher.describe(),
        "commands": outcome.commands,
        "codes": outcome.codes,
        "seconds": round(outcome.seconds, 1),
        "output": _tail(outcome.tail(), 12),
        "equal_to_one_node": _compare(reference, run),
    }
    killed = work / f"{name}-killed"
    config = multinode_config(data, killed)
    failure = kill_node_when(
        processes,
        launcher,
        config,
        killed,
        f"{name}-killed",
        lambda: last_logged_step(killed) >= TRIGGER_STEP,
        f"step {TRIGGER_STEP} logged",
        timeout=LAUNCH_TIMEOUT,
    )
    relaunch = run_to_end(processes, launcher, config, f"{name}-relaunch", LAUNCH_TIMEOUT)
    record["failure"] = _failure_record(failure, killed, relaunch, reference)
    record["failure"]["killed"] = "every process of node 1 (launcher and training processes)"
    return record


def hang_drill(processes, data, work: Path, reference: Path, timeout: float = 30.0) -> dict:
    run = work / "hang"
    config = multinode_config(data, run, **{"parallel.collective_timeout": timeout})
    launcher = Torchrun(2, 2)
    failure = kill_node_when(
        processes,
        launcher,
        config,
        run,
        "hang",
        lambda: last_logged_step(run) >= TRIGGER_STEP,
        f"step {TRIGGER_STEP} logged",
        sig=signal.SIGSTOP,
        timeout=LAUNCH_TIMEOUT,
        exit_bound=timeout * 10,
    )
    relaunch = run_to_end(processes, launcher, config, "hang-relaunch", LAUNCH_TIMEOUT)
    record = _failure_record(failure, run, relaunch, reference)
    record.update(signal="SIGSTOP", collective_timeout_s=timeout, commands=failure.commands)
    record["killed"] = "node 1 frozen (SIGSTOP) until node 0 exited, then SIGKILLed"
    return {"launcher": "torchrun, node 1 hung", "failure": record}


def _slurm_job(cluster, config: Path, out: Path) -> str:
    return cluster.sbatch(
        ["--nodes=2", "--gpus-per-node=0", f"--output={out}", "configs/launch/pretrain.sbatch", str(config)],
        cwd=CHECKOUT,
        env=node_env({"PROCS_PER_NODE": "2", "DEEPSPEED": venv_tool("deepspeed")}),
    )


def _wait_for_step(run: Path, step: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while last_logged_step(run) < step:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{run}: step {step} not logged within {timeout:.0f}s")
        time.sleep(0.002)


def _slurm_failure(cluster, data, work: Path, reference: Path, name: str, stop) -> dict:
    """Submit pretrain.sbatch, stop it after step 6 with ``stop(job)``, resubmit the same job."""
    run = work / name
    config = multinode_config(data, run)
    job = _slurm_job(cluster, config, work / f"{name}-1.out")
    _wait_for_step(run, TRIGGER_STEP, LAUNCH_TIMEOUT)
    logged = last_logged_step(run)
    sent, how = stop(job)
    while cluster.queue([job]):
        time.sleep(0.05)
    gone = time.monotonic() - sent
    states = cluster.final_states([job])
    complete = [step for step, _ in complete_steps(RunDir(run).state)]
    unfinished = unfinished_checkpoints(run)
    started = time.monotonic()
    again = _slurm_job(cluster, config, work / f"{name}-2.out")
    final = cluster.wait([again], timeout=LAUNCH_TIMEOUT)
    return {
        "killed": how,
        "trigger": f"step {TRIGGER_STEP} logged",
        "last_logged_step_at_kill": logged,
        "job_gone_from_squeue_after_s": round(gone, 2),
        "job_state": dataclasses.asdict(states[job]),
        "job_output": _key_lines((work / f"{name}-1.out").read_text()),
        "complete_states_after_failure": complete,
        "unfinished_checkpoints_after_failure": unfinished,
        "resubmitted_job_state": dataclasses.asdict(final[again]),
        "resubmit_to_end_s": round(time.monotonic() - started, 1),
        "resumed_from_step": resumed_from(run)[-1],
        "relaunch_output": _tail((work / f"{name}-2.out").read_text(), 10),
        "final_equal_to_one_node": _compare(reference, run),
    }


def slurm_drill(processes, data, work: Path, reference: Path) -> dict:
    cluster = loopback_slurm.LoopbackSlurm(processes, nodes=2)
    started = time.monotonic()
    cluster.start()
    try:
        record = {
            "launcher": "SLURM: configs/launch/pretrain.sbatch, 2 nodes × 2 processes",
            "cluster_start_s": round(time.monotonic() - started, 1),
            "accounting": cluster.accounting,
        }
        run = work / "slurm-run"
        config = multinode_config(data, run)
        out = work / "slurm-run.out"
        t0 = time.monotonic()
        job = _slurm_job(cluster, config, out)
        states = cluster.wait([job], timeout=LAUNCH_TIMEOUT)
        record.update(
            commands=[
                f"sbatch --nodes=2 --gpus-per-node=0 --output={out} configs/launch/pretrain.sbatch {config}"
                "   (environment: PROCS_PER_NODE=2)"
            ],
            seconds=round(time.monotonic() - t0, 1),
            job_state=dataclasses.asdict(states[job]),
            output=_tail(out.read_text(), 12),
            equal_to_one_node=_compare(reference, run),
        )

        def kill_n2(job):
            sent = time.monotonic()
            pids = cluster.kill_jobs_on("n2")
            return sent, f"every job process on node n2 SIGKILLed ({len(pids)} processes; daemons up)"

        def cancel(job):
            return cluster.scancel(job), f"scancel {job}"

        record["failure"] = _slurm_failure(cluster, data, work, reference, "slurm-node-killed", kill_n2)
        record["scancel"] = _slurm_failure(cluster, data, work, reference, "slurm-cancelled", cancel)
        return record
    finally:
        processes.close()
        cluster.close()


def suite_drill(processes, data, work: Path) -> dict:
    cluster = loopback_slurm.LoopbackSlurm(processes, nodes=2)
    started = time.monotonic()
    cluster.start()
    try:
        suite_file = slurm_suite(work / "suite", data)
        cluster_start_s = round(time.monotonic() - started, 1)
        drill = cancel_suite_run(
            cluster,
            processes,
            suite_file,
            work / "suite" / "runs",
            after_step=SUITE_CANCEL_STEP,
            timeout=LAUNCH_TIMEOUT,
        )
        logs = work / "suite/runs/logs"
        return {
            "launcher": "SLURM: the array `trilm suite launch SUITE --slurm` writes, 2 runs of 1 process",
            "cluster_start_s": cluster_start_s,
            "accounting": cluster.accounting,
            "commands": drill.commands,
            "outputs": [
                drill.status if "status" in command else _tail(text, 12)
                for command, text in zip(drill.commands, drill.outputs, strict=True)
            ],
            "array_script": drill.array_script.splitlines(),
            "job": drill.job,
            "runs": drill.runs,
            "failure": {
                "killed": f"scancel {drill.job}_0 ({drill.cancelled})",
                "trigger": f"step {SUITE_CANCEL_STEP} logged and a state written",
                "last_logged_step_at_kill": drill.last_logged_step,
                "task_gone_from_squeue_after_s": round(drill.gone_s, 2),
                "job_states": drill.states,
                "complete_states_after_failure": drill.complete_states,
                "unfinished_checkpoints_after_failure": drill.unfinished,
                "status_after_failure": drill.status,
                "resubmitted_job": drill.resubmitted_job,
                "resubmitted_runs": drill.resubmitted_runs,
                "resubmitted_job_states": drill.resubmitted_states,
                "relaunch_to_end_s": round(drill.relaunch_s, 1),
                "resumed_from_step": drill.resumed_from[-1] if drill.resumed_from else None,
                "job_output": _key_lines((logs / f"slurm-{drill.job}_0.out").read_text()),
                "relaunch_output": _resume_lines((logs / f"slurm-{drill.resubmitted_job}_0.out").read_text()),
                "uninterrupted_exit_code": drill.straight_code,
                "final_equal_to_uninterrupted_run": _compare(drill.straight, drill.run_dir),
            },
        }
    finally:
        processes.close()
        cluster.close()


def portable(value, replacements: list[tuple[str, str]]):
    """The record without this machine's paths: the checkout as ``.``, its environment as ``.venv``, the
    scratch directory as ``$WORK`` (commands are quoted as they would be typed in the repository)."""
    if isinstance(value, str):
        for old, new in replacements:
            value = value.replace(old, new)
        return value
    if isinstance(value, list | tuple):
        return [portable(v, replacements) for v in value]
    if isinstance(value, dict):
        return {k: portable(v, replacements) for k, v in value.items()}
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drills", default=",".join(DRILLS), help=f"comma-separated, of {', '.join(DRILLS)}")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument(
        "--work", type=Path, default=None, help="scratch directory (default: a temporary one)"
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="keep the other drills already in today's file (its 1-node reference too unless rerun)",
    )
    args = parser.parse_args()
    wanted = [d for d in args.drills.split(",") if d]
    unknown = sorted(set(wanted) - set(DRILLS))
    if unknown:
        parser.error(f"unknown drills {unknown}")
    work = args.work or Path(tempfile.mkdtemp(prefix="trilm-multinode-"))
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"multinode-loopback-{today()}.json"
    script = command(__spec__.name)
    report = {
        "run": "multinode_config (trilm/testing/cluster/runs.py): trilm-nano, TP 2 × DP 2, ZeRO-1, 16 steps",
        "drills": {},
    }
    if args.update and out.exists():
        report = json.loads(out.read_text())
        report.setdefault("updates", []).append({"script": script, "drills": wanted})

    venv = Path(sys.prefix)
    replacements = sorted(
        {
            (str(work.resolve()), "$WORK"),
            (str(work), "$WORK"),
            (str(venv.resolve()), ".venv"),
            (str(venv), ".venv"),
            (str(CHECKOUT.resolve()), "."),
            (str(CHECKOUT), "."),
        },
        key=lambda pair: -len(pair[0]),
    )

    def save() -> None:
        write_result(out, portable(report, replacements), module=__spec__.name)

    data = prepare_embedded(work / "data", vocab_size=512, workers=1, progress=False)
    with ProcessSet(work / "logs") as processes:
        reference = work / "one-node"
        if set(wanted) - {"suite"}:  # every drill but the suite's compares with the 1-node run
            outcome = run_to_end(
                processes, Torchrun(1, 4), multinode_config(data, reference), "one-node", LAUNCH_TIMEOUT
            )
            report["one_node"] = {
                "commands": outcome.commands,
                "codes": outcome.codes,
                "seconds": round(outcome.seconds, 1),
            }
            save()
        for drill in wanted:
            print(f"drill {drill} …", flush=True)
            load = os.getloadavg()
            if drill == "torchrun":
                record = launcher_drill(drill, Torchrun(2, 2), processes, data, work, reference)
            elif drill == "deepspeed":
                record = launcher_drill(
                    drill, DeepSpeedNoSsh(work / "hostfile", 2, 2), processes, data, work, reference
                )
            elif drill == "pdsh":
                if sshd.missing():
                    record = {"skipped": f"needs {', '.join(sshd.missing())}"}
                else:
                    server = sshd.LoopbackSshd(processes, work / "ssh").start()
                    launcher = DeepSpeedSsh(work / "pdsh-hostfile", 2, 2, server.env)
                    record = launcher_drill(drill, launcher, processes, data, work, reference)
            elif drill == "slurm":
                reasons = loopback_slurm.missing()
                record = (
                    {"skipped": "; ".join(reasons)}
                    if reasons
                    else slurm_drill(ProcessSet(work / "slurm-logs"), data, work, reference)
                )
            elif drill == "suite":
                reasons = loopback_slurm.missing()
                record = (
                    {"skipped": "; ".join(reasons)}
                    if reasons
                    else suite_drill(ProcessSet(work / "suite-logs"), data, work)
                )
            else:
                record = hang_drill(processes, data, work, reference)
            record["load_average_at_start"] = load
            report["drills"][drill] = record
            save()
            print(json.dumps(record, indent=1)[:4000], flush=True)
    print(f"wrote {out}")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
