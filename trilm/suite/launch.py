"""``trilm suite launch``: train a suite's runs here, one after another, or write (and submit) one launch
script per run for a DeepSpeed hostfile or a SLURM array.

Relaunching is idempotent because the run directory is the state: a finished run is skipped (and its
config never rewritten), a stopped one resumes from its newest complete state (the trainer does that by
itself when its run directory has one), a run whose lock a live process holds is left alone, and under
SLURM a run whose array task is still queued or running (``squeue``) is not submitted twice. A suite file
changed since its runs were trained is refused before anything is written, naming the runs and the keys
that differ: those runs would be other runs, and their directories hold the old ones.

What gets written under ``<root>``::

    configs/<run>.yaml         the resolved run config (``trilm train --config`` trains exactly that run)
    launch/<run>.sh            its launch script: the DeepSpeed launcher over a hostfile or a SLURM allocation
    launch/array-<shape>.sbatch  one SLURM array per node shape; task i runs launch/<run_i>.sh
    launch/jobs.jsonl          submitted SLURM jobs (array id → runs), read back to avoid double submission
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from trilm.atomic import write_text
from trilm.config import ConfigError
from trilm.configs import config_dir
from trilm.data.pipeline import prepare_embedded
from trilm.model.flops import flops_per_token
from trilm.parallel import shutdown_parallel
from trilm.suite.config import Suite, SuiteRun
from trilm.suite.jobs import run_concurrently
from trilm.suite.status import FAILED, run_status
from trilm.train.checkpoint import RunDir, lock_holder
from trilm.train.config import TrainConfig, changed_keys

TRAIN_MODULE = "trilm.train"
"""What every launcher starts in each process (``python -m trilm.train``; torchrun's and the DeepSpeed
launcher's ``--module``): the installed trainer, so a launch needs no checkout."""
NODE_SCRIPT = config_dir() / "launch" / "deepspeed-node.sh"


@dataclasses.dataclass
class Outcome:
    run: str
    action: str
    """``skipped``, ``trained``, ``resumed``, ``running elsewhere``, ``queued``, ``written``, ``failed``"""
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.run:<18} {self.action}{': ' + self.detail if self.detail else ''}"


def prepare_data(suite: Suite, progress: bool = True) -> None:
    """Prepare the embedded corpus under ``<root>/data`` when the suite asks for it (reused when present)."""
    if not suite.config.data.embedded:
        return

    prepare_embedded(
        suite.root / "data", vocab_size=suite.config.data.vocab_size, workers=2, progress=progress
    )


def check_runs_unchanged(suite: Suite, runs: list[SuiteRun]) -> None:
    """Refuse runs whose configs differ from the ones their run directories were trained with."""

    problems = []
    for run in runs:
        saved = RunDir(run.run_dir).config
        if not saved.is_file():
            continue
        try:
            old = TrainConfig.from_yaml(saved).to_dict()
        except ConfigError as exc:
            problems.append(f"{run.name}: {saved} is unreadable ({exc})")
            continue
        now = run.cfg.replace(model=run.cfg.model.resolved(run.cfg.parallel.tensor_parallel)).to_dict()
        keys = changed_keys(old, now)
        if keys:
            shown = ", ".join(keys[:6]) + (" …" if len(keys) > 6 else "")
            problems.append(f"{run.name}: {shown} differ from {saved}")
    if problems:
        raise ConfigError(
            f"{suite.path}: the suite no longer matches runs already trained under {suite.root} ("
            + "; ".join(problems)
            + "); restore the suite file, or launch the changed suite into another root (--run-dir)"
        )


def write_run_configs(suite: Suite, runs: list[SuiteRun]) -> dict[str, Path]:
    """``configs/<run>.yaml`` of every run; a finished run's file is never rewritten (it is what it was
    trained with)."""
    out_dir = suite.root / "configs"
    paths = {}
    for run in runs:
        path = out_dir / f"{run.name}.yaml"
        paths[run.name] = path
        if path.is_file() and run_status(run).state == "finished":
            continue
        header = f"# suite {suite.name}, run {run.name}: written by `trilm suite launch` from {suite.path}\n"
        write_text(path, header + run.cfg.to_yaml())
    return paths


def _todo(run: SuiteRun, force: bool) -> Outcome | None:
    """An Outcome when the run must not be started now (finished, or apparently running), else None."""
    status = run_status(run)
    if status.state == "finished":
        return Outcome(run.name, "skipped", f"finished ({status.steps:,} steps)")
    if status.state == "running" and not force:
        holder = lock_holder(run.run_dir)
        age = time.time() - (status.last_update or 0)
        why = f"its lock is held by {holder}" if holder else f"metrics written {age:.0f}s ago"
        return Outcome(
            run.name,
            "running elsewhere",
            f"{why}, at step {status.step:,}; not started twice (--force starts it)",
        )
    return None


def _resume_detail(run: SuiteRun) -> str:
    status = run_status(run)
    if status.last_state is None and run.parent:
        return f"branches from {run.parent} at step {run.branch_step:,}"
    if status.last_state is None:
        return "from scratch"
    return f"resumes from step {status.last_state:,}"


def cheapest_first(runs: list[SuiteRun]) -> list[SuiteRun]:
    """Runs by training FLOPs, families interleaved: a suite stopped half-way has whole sizes to compare."""

    order = {f: i for i, f in enumerate(dict.fromkeys(r.family for r in runs))}

    def cost(run: SuiteRun) -> tuple[float, int]:
        cfg = run.cfg
        flops = flops_per_token(cfg.model, cfg.sequence_length) * cfg.steps * cfg.batch_tokens
        return flops, order[run.family]

    return sorted(runs, key=cost)


# ---- local ---------------------------------------------------------------------------------------------
def launch_local(
    suite: Suite,
    runs: list[SuiteRun],
    *,
    dry_run: bool = False,
    progress: bool = True,
    force: bool = False,
    jobs: int = 1,
    echo: Callable[[str], None] = print,
) -> list[Outcome]:
    """Train the runs in this machine, one after another, or ``jobs`` at a time as separate single-threaded
    processes (:mod:`trilm.suite.jobs`); a failing run is recorded and the next one starts."""
    if jobs < 1:
        raise ConfigError(f"--jobs: must be >= 1, got {jobs}")
    check_runs_unchanged(suite, runs)
    configs = write_run_configs(suite, runs)
    if not dry_run:
        prepare_data(suite, progress)
    outcomes = []
    concurrent: list[tuple[SuiteRun, Path, str]] = []
    for i, run in enumerate(runs, start=1):
        skip = _todo(run, force)
        if skip is not None:
            outcomes.append(skip)
            echo(f"[{i}/{len(runs)}] {skip}")
            continue
        detail = _resume_detail(run)
        if dry_run:
            outcomes.append(Outcome(run.name, "would train", f"{detail}; {_local_command(run, configs)}"))
            echo(f"[{i}/{len(runs)}] {outcomes[-1]}")
            continue
        if jobs > 1 and run.devices == 1:
            concurrent.append((run, configs[run.name], detail))
            outcomes.append(Outcome(run.name, "pending"))
            continue
        echo(f"[{i}/{len(runs)}] {run.name}: {detail} → {run.run_dir}")
        outcomes.append(_train_one(run, configs[run.name], detail, progress))
        echo(f"[{i}/{len(runs)}] {outcomes[-1]}")
    if concurrent:
        echo(f"training {len(concurrent)} run(s), {jobs} at a time (logs: <run dir>/train.log)")
        done = run_concurrently(concurrent, jobs, echo)
        outcomes = [Outcome(o.run, *done[o.run]) if o.action == "pending" else o for o in outcomes]
    return outcomes


def _local_command(run: SuiteRun, configs: dict[str, Path]) -> str:
    config = shlex.quote(str(configs[run.name]))
    if run.devices == 1:
        return f"trilm train --config {config}"
    return f"torchrun --nproc_per_node {run.devices} -m {TRAIN_MODULE} --config {config}"


def _train_one(run: SuiteRun, config: Path, detail: str, progress: bool) -> Outcome:
    failed = run.run_dir / FAILED
    failed.unlink(missing_ok=True)
    action = "resumed" if detail.startswith("resumes") else "trained"
    try:
        if run.devices == 1:
            # deferred for start-up time: loads megatron only when called
            from trilm.train.trainer import Trainer

            cfg = run.cfg.with_overrides([f"log.progress={str(progress).lower()}"])
            try:
                summary = Trainer(cfg).fit()
            finally:
                shutdown_parallel()
            final = summary.val_losses.get(summary.steps)
            loss = f", val loss {final:.4f}" if final is not None else ""
            return Outcome(run.name, action, f"{summary.steps:,} steps{loss}")
        torchrun = Path(sys.executable).parent / "torchrun"
        cmd = [str(torchrun), "--nproc_per_node", str(run.devices), "-m", TRAIN_MODULE]
        cmd += ["--config", str(config)]
        done = subprocess.run(cmd, check=False)
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd)} exited with status {done.returncode}")
        return Outcome(run.name, action, f"{run.cfg.steps:,} steps")
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # one failing run must not stop the suite; it is recorded
        run.run_dir.mkdir(parents=True, exist_ok=True)
        message = f"{type(exc).__name__}: {exc}"
        write_text(failed, traceback.format_exc() + "\n" + message + "\n")
        return Outcome(run.name, "failed", message)


# ---- scripts -------------------------------------------------------------------------------------------
def _deepspeed() -> str:
    candidate = Path(sys.executable).parent / "deepspeed"
    return str(candidate) if candidate.exists() else "deepspeed"


def read_hostfile(path: Path) -> list[tuple[str, int]]:
    """``host slots=N`` lines (comments and blank lines ignored); errors name the file and line."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such hostfile")
    hosts = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        match = re.fullmatch(r"(\S+)\s+slots=(\d+)", text)
        if not match:
            raise ConfigError(f"{path} line {number}: expected 'HOST slots=N', got {line.strip()!r}")
        hosts.append((match.group(1), int(match.group(2))))
    if not hosts:
        raise ConfigError(f"{path}: no hosts")
    return hosts


def _check_fits(path: Path, hosts: list[tuple[str, int]], runs: list[SuiteRun]) -> None:
    for run in runs:
        usable = [h for h, slots in hosts if slots >= run.devices_on_node]
        if len(usable) < run.nodes:
            raise ConfigError(
                f"{path}: run {run.name} needs {run.nodes} node(s) with {run.devices_on_node} slots;"
                f" the hostfile has {len(usable)} such node(s)"
            )


def run_script(suite: Suite, run: SuiteRun, config: Path, hostfile: Path | None) -> str:
    """The launch script of one run: the DeepSpeed launcher over a given hostfile (pdsh/ssh from this
    host), or under SLURM one launcher per node started by ``srun`` (``configs/launch/deepspeed-node.sh``,
    no ssh between nodes, every process tracked by SLURM)."""
    lines = [
        "#!/usr/bin/env bash",
        f"# trilm suite {suite.name}, run {run.name}: {run.family} {run.size}, {run.cfg.steps:,} steps of"
        f" {run.cfg.batch_tokens:,} tokens,",
        f"# {run.devices} {_device_word(suite)} = TP {run.tensor_parallel} × DP {run.data_parallel} on"
        f" {run.nodes} node(s). Written by `trilm suite launch`;",
        "# rerunning it resumes from the newest complete state, and a finished run stops at once.",
        "set -euo pipefail",
        f"cd {shlex.quote(os.getcwd())}",
        f"CONFIG={shlex.quote(str(config.resolve()))}",
    ]
    if hostfile is None:
        lines += [
            'if [ -z "${SLURM_JOB_NODELIST:-}" ]; then echo "run me under SLURM (sbatch)" >&2; exit 2; fi',
            f"export PROCS_PER_NODE={run.devices_on_node} DEEPSPEED={shlex.quote(_deepspeed())}",
            'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
            'export MASTER_ADDR=${MASTER_ADDR:-$(scontrol show node "$HEAD"'
            " | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')}",
            "export MASTER_PORT=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}",
            f"exec srun --nodes {run.nodes} --ntasks-per-node=1 --kill-on-bad-exit=1"
            f" {shlex.quote(str(NODE_SCRIPT))} \\",
            '    --config "$CONFIG"',
            "",
        ]
        return "\n".join(lines)
    lines += [
        f"HOSTFILE={shlex.quote(str(hostfile.resolve()))}",
        "MASTER=$(grep -v '^\\s*#' \"$HOSTFILE\" | awk 'NF {print $1; exit}')",
        f'exec {shlex.quote(_deepspeed())} --hostfile "$HOSTFILE" --num_nodes {run.nodes}'
        f" --num_gpus {run.devices_on_node} \\",
        '    --master_addr "$MASTER" --master_port "${MASTER_PORT:-29500}" \\',
        f'    --module {TRAIN_MODULE} --config "$CONFIG"',
        "",
    ]
    return "\n".join(lines)


def _device_word(suite: Suite) -> str:
    return "GPU(s)" if suite.config.hardware.is_gpu else "process(es)"


def array_script(suite: Suite, runs: list[SuiteRun], scripts: dict[str, Path], extra: list[str]) -> str:
    """One SLURM array over runs of one node shape; task i execs the launch script of run i."""
    first = runs[0]
    root = suite.root.resolve()
    lines = [
        "#!/usr/bin/env bash",
        f"# trilm suite {suite.name}: {len(runs)} run(s) of {first.nodes} node(s) × {first.devices_on_node}"
        f" {_device_word(suite)}, one array task per run.",
        "# Written by `trilm suite launch --slurm`; resubmitting it resumes unfinished runs.",
        f"#SBATCH --job-name=trilm-{suite.name}",
        f"#SBATCH --array=0-{len(runs) - 1}",
        f"#SBATCH --nodes={first.nodes}",
        "#SBATCH --ntasks-per-node=1",
        # a CPU suite asks for cores, not GPUs (a cluster without GPU GRES refuses a GPU request)
        f"#SBATCH --gpus-per-node={first.devices_on_node}"
        if suite.config.hardware.is_gpu
        else f"#SBATCH --cpus-per-task={first.devices_on_node}",
        f"#SBATCH --output={root / 'logs'}/slurm-%A_%a.out",
    ]
    if first.devices_on_node == first.devices_per_node:
        lines.append("#SBATCH --exclusive")
    lines += [f"#SBATCH {arg}" for arg in extra]
    names = " ".join(shlex.quote(str(scripts[r.name].resolve())) for r in runs)
    lines += [
        "set -euo pipefail",
        f"SCRIPTS=({names})",
        'exec bash "${SCRIPTS[$SLURM_ARRAY_TASK_ID]}"',
        "",
    ]
    return "\n".join(lines)


def _write(path: Path, text: str) -> Path:
    write_text(path, text)
    path.chmod(0o755)
    return path


def write_scripts(
    suite: Suite, runs: list[SuiteRun], hostfile: Path | None = None
) -> tuple[dict[str, Path], dict[str, Path]]:
    """Per-run scripts (and run configs); returns ``(configs, scripts)`` keyed by run name."""
    if hostfile is not None:
        _check_fits(hostfile, read_hostfile(hostfile), runs)
    configs = write_run_configs(suite, runs)
    launch_dir = suite.root / "launch"
    scripts = {
        run.name: _write(launch_dir / f"{run.name}.sh", run_script(suite, run, configs[run.name], hostfile))
        for run in runs
    }
    return configs, scripts


def launch_hostfile(
    suite: Suite,
    runs: list[SuiteRun],
    hostfile: Path,
    *,
    dry_run: bool = False,
    force: bool = False,
    echo: Callable[[str], None] = print,
) -> list[Outcome]:
    """Run each pending run's script in turn (each over the hostfile's first nodes)."""
    check_runs_unchanged(suite, runs)
    pending, outcomes = [], []
    for run in runs:
        skip = _todo(run, force)
        if skip is not None:
            outcomes.append(skip)
            echo(str(skip))
        else:
            pending.append(run)
    _, scripts = write_scripts(suite, pending, hostfile)
    if not dry_run:
        prepare_data(suite)
    for run in pending:
        detail = _resume_detail(run)
        if dry_run:
            outcomes.append(Outcome(run.name, "written", f"{detail}; bash {scripts[run.name]}"))
            echo(str(outcomes[-1]))
            continue
        echo(f"{run.name}: {detail}: bash {scripts[run.name]}")
        failed = run.run_dir / FAILED
        failed.unlink(missing_ok=True)
        done = subprocess.run(["bash", str(scripts[run.name])], check=False)
        if done.returncode:
            run.run_dir.mkdir(parents=True, exist_ok=True)
            write_text(failed, f"{scripts[run.name]} exited with status {done.returncode}\n")
            outcomes.append(Outcome(run.name, "failed", f"exit status {done.returncode}"))
        else:
            outcomes.append(Outcome(run.name, "resumed" if "resumes" in detail else "trained"))
        echo(str(outcomes[-1]))
    return outcomes


# ---- SLURM -----------------------------------------------------------------------------------------------
def _queued_runs(suite: Suite) -> dict[str, str]:
    """Runs of this suite whose SLURM array task is still pending or running: {run: job id}."""
    record_file = suite.root / "launch" / "jobs.jsonl"
    if not record_file.is_file():
        return {}
    records = [json.loads(line) for line in record_file.read_text().splitlines() if line.strip()]
    if not records or shutil.which("squeue") is None:
        return {}
    ids = ",".join(str(r["job"]) for r in records)
    done = subprocess.run(
        ["squeue", "-h", "-r", "-j", ids, "-o", "%F %K"], capture_output=True, text=True, check=False
    )
    live = set()
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            live.add((parts[0], int(parts[1])))
    out = {}
    for record in records:
        for task, name in enumerate(record["runs"]):
            if (str(record["job"]), task) in live:
                out[name] = f"{record['job']}_{task}"
    return out


def launch_slurm(
    suite: Suite,
    runs: list[SuiteRun],
    *,
    dry_run: bool = False,
    force: bool = False,
    sbatch_args: list[str] | None = None,
    echo: Callable[[str], None] = print,
) -> list[Outcome]:
    """Write per-run scripts and one array per node shape; submit the arrays with ``sbatch``."""
    check_runs_unchanged(suite, runs)
    queued = {} if dry_run else _queued_runs(suite)
    pending, outcomes = [], []
    for run in runs:
        skip = _todo(run, force)
        if skip is None and run.name in queued and not force:
            skip = Outcome(run.name, "queued", f"SLURM job {queued[run.name]} is pending or running")
        if skip is not None:
            outcomes.append(skip)
            echo(str(skip))
        else:
            pending.append(run)
    if not pending:
        return outcomes
    _, scripts = write_scripts(suite, pending)
    (suite.root / "logs").mkdir(parents=True, exist_ok=True)
    shapes: dict[tuple[int, int], list[SuiteRun]] = {}
    for run in pending:
        shapes.setdefault((run.nodes, run.devices_on_node), []).append(run)
    if not dry_run:
        prepare_data(suite)
    for (nodes, per_node), group in sorted(shapes.items()):
        path = _write(
            suite.root / "launch" / f"array-{nodes}x{per_node}.sbatch",
            array_script(suite, group, scripts, sbatch_args or []),
        )
        names = [r.name for r in group]
        if dry_run:
            outcomes += [Outcome(n, "written", f"task {i} of sbatch {path}") for i, n in enumerate(names)]
            echo(f"would submit: sbatch {path}  ({', '.join(names)})")
            continue
        if shutil.which("sbatch") is None:
            raise ConfigError("sbatch is not on PATH: run on a SLURM login node, or use --dry-run")
        done = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True)
        if done.returncode:
            raise ConfigError(f"sbatch {path} failed ({done.returncode}): {done.stderr.strip()}")
        job = done.stdout.strip().split(";")[0]
        with (suite.root / "launch" / "jobs.jsonl").open("a") as fh:
            record = {"job": job, "script": str(path), "runs": names, "time": time.time()}
            fh.write(json.dumps(record) + "\n")
        outcomes += [Outcome(n, "submitted", f"SLURM job {job}_{i}") for i, n in enumerate(names)]
        echo(f"submitted {path}: job {job} ({', '.join(names)})")
    return outcomes
