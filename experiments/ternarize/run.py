"""The ternarization experiment: a TriLM from scratch against a FloatLM converted late, at equal tokens.

For each size and seed, with D the total budget:

- ``trilm`` and ``floatlm``: each family trained from scratch for D tokens (the two references);
- ``floatlm-pre{f}``: a FloatLM trained for (1 − f)·D tokens on its own cosine schedule;
- ``trilm-conv{f}`` and ``trilm-conv{f}-kd``: that FloatLM turned into a TriLM by training f·D more tokens
  (``init_from`` across families, the TriLM recipe's schedule with a short warm-up), without and with
  distillation from the FloatLM it started from.

Every run's final validation loss is a row of ``results.csv`` in the output folder, written as each run
ends (so an interrupted experiment keeps what it measured and ``run`` again trains only what is missing);
:mod:`experiments.ternarize.report` turns the rows into the table, the paired differences against the
from-scratch TriLM with intervals over seeds, and the plot.

    python -m experiments.ternarize [--sizes 64x2 128x4] [--seeds 1 2 3] [--jobs 2]
    python -m experiments.ternarize crossover ...   (the crossover grid: experiments.ternarize.crossover)
    python -m experiments.ternarize.report
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import CHECKOUT, write_result

OUT = CHECKOUT / "docs" / "results" / "ternarize"
SIZES: dict[str, dict[str, int]] = {
    "32x2": {"hidden": 32, "ffn": 128, "heads": 1, "layers": 2},
    "64x2": {"hidden": 64, "ffn": 192, "heads": 2, "layers": 2},
    "96x3": {"hidden": 96, "ffn": 256, "heads": 3, "layers": 3},
    "128x4": {"hidden": 128, "ffn": 384, "heads": 4, "layers": 4},
}
"""The CPU ladder's shapes (the cooldown experiment's), context 128."""
FRACTIONS = (0.1, 0.25, 0.5)
BATCH_TOKENS = 1024
PEAK_LR = 4.0e-3
"""The ladder's best peak rate at these sizes, used by every run (conversions included)."""
CONVERSION_WARMUP = 0.05
DISTILL = {"weight": 0.5, "temperature": 1.0}
FIELDS = ["run", "size", "seed", "arm", "fraction", "distill", "tokens", "val_loss", "seconds"]


@dataclasses.dataclass(frozen=True)
class Run:
    size: str
    seed: int
    arm: str
    """``trilm``, ``floatlm``, ``floatlm-pre``, ``trilm-conv`` or ``trilm-conv-kd``."""
    fraction: float = 0.0
    """f: the share of the budget trained as a TriLM after conversion (0 for the from-scratch runs)."""

    @property
    def name(self) -> str:
        tag = f"{self.arm}{self.fraction:g}" if self.fraction else self.arm
        if self.arm == "trilm-conv-kd":
            tag = f"trilm-conv{self.fraction:g}-kd"
        return f"{tag}-{self.size}-s{self.seed}"

    def tokens(self, budget: int) -> int:
        if self.arm == "floatlm-pre":
            share = 1 - self.fraction
        elif self.arm.startswith("trilm-conv"):
            share = self.fraction
        else:
            share = 1.0
        return round(share * budget / BATCH_TOKENS) * BATCH_TOKENS

    @property
    def parent(self) -> Run | None:
        """The FloatLM a conversion starts from (and learns from, with distillation)."""
        if not self.arm.startswith("trilm-conv"):
            return None
        return Run(self.size, self.seed, "floatlm-pre", self.fraction)


def plan(sizes: list[str], seeds: list[int]) -> tuple[list[Run], list[Run]]:
    """(runs that start from scratch, conversions that start from one of them)."""
    first, second = [], []
    for size in sizes:
        for seed in seeds:
            first += [Run(size, seed, "trilm"), Run(size, seed, "floatlm")]
            first += [Run(size, seed, "floatlm-pre", f) for f in FRACTIONS]
            second += [Run(size, seed, a, f) for f in FRACTIONS for a in ("trilm-conv", "trilm-conv-kd")]
    return first, second


def final_snapshot(root: Path, run: Run, budget: int) -> Path:
    return root / run.name / "snapshots" / f"step-{run.tokens(budget) // BATCH_TOKENS}"


def run_config(run: Run, root: Path, data: dict[str, Path], budget: int) -> dict[str, Any]:
    """The run's TrainConfig as a dict: the quickstart recipe of its family at the ladder's batch and rate."""
    family = "floatlm" if run.arm.startswith("floatlm") else "trilm"
    cfg = yaml.safe_load((CHECKOUT / "configs" / "train" / f"quickstart-{family}.yaml").read_text())
    steps = run.tokens(budget) // BATCH_TOKENS
    cfg.update(
        run_dir=str(root / run.name),
        seed=run.seed,
        model={"preset": f"{family}-nano", "vocab_size": 2048, "context": 128, **SIZES[run.size]},
        tokens=run.tokens(budget),
        batch_tokens=BATCH_TOKENS,
        micro_batch=8,
        seq_len=128,
        data={
            "train_dir": str(data["train"]),
            "valid_dir": str(data["validation"]),
            "tokenizer": str(data["tokenizer"]),
            "valid_sequences": 256,
            "seed": run.seed,
        },
        checkpoint={"snapshot_every": steps, "log_spaced": False, "state_every": steps, "keep_last": 1},
        log={"every": 25, "eval_every": 0, "tensorboard": False, "progress": False},
    )
    cfg["optim"] = {**cfg.get("optim", {}), "lr": PEAK_LR}
    parent = run.parent
    if parent is not None:
        source = str(final_snapshot(root, parent, budget))
        cfg["init_from"] = source
        cfg["model"] = {"family": "trilm"}
        cfg["convert"] = {"recipe": "as_written"}  # the split experiment's recipe is its config, all of it
        cfg["schedule"] = {**cfg["schedule"], "warmup": CONVERSION_WARMUP}
        if run.arm == "trilm-conv-kd":
            cfg["distill"] = {"teacher": source, **DISTILL}
    return cfg


def _train(run: Run, root: Path, data: dict[str, Path], budget: int) -> tuple[Run, float, str]:
    config = root / "configs" / f"{run.name}.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump(run_config(run, root, data, budget), sort_keys=False))
    return (run, *train_in_subprocess(config))


def train_in_subprocess(config: Path) -> tuple[float, str]:
    """``trilm train --config CONFIG`` on one thread: (seconds, the log's tail if it failed, else "")."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(CHECKOUT)}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "trilm", "train", "--config", str(config)],
        env=env,
        cwd=CHECKOUT,
        capture_output=True,
        text=True,
    )
    log = (done.stdout + done.stderr)[-3000:]
    return time.perf_counter() - started, "" if done.returncode == 0 else log


def val_loss(snapshot: Path) -> float:
    from trilm.store.snapshot import read_snapshot_config

    _, meta = read_snapshot_config(snapshot)
    if meta.val_loss is None:
        raise RuntimeError(f"{snapshot}: no validation loss recorded")
    return float(meta.val_loss)


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(sorted(rows, key=lambda r: (r["size"], int(r["seed"]), r["run"])))
    tmp.replace(path)


def run(args: argparse.Namespace) -> None:
    from trilm.data.pipeline import prepare_embedded

    root, out = Path(args.root), Path(args.out)
    data = prepare_embedded(root / "data", vocab_size=2048, workers=1, progress=False)
    rows = {r["run"]: r for r in read_rows(out / "results.csv")}
    first, second = plan(args.sizes, args.seeds)

    def record(result: tuple[Run, float, str]) -> None:
        run_, seconds, error = result
        if error:
            print(f"{run_.name}: FAILED\n{error}", file=sys.stderr, flush=True)
            return
        loss = val_loss(final_snapshot(root, run_, args.tokens))
        rows[run_.name] = {
            "run": run_.name,
            "size": run_.size,
            "seed": run_.seed,
            "arm": run_.arm,
            "fraction": run_.fraction,
            "distill": int(run_.arm.endswith("-kd")),
            "tokens": run_.tokens(args.tokens),
            "val_loss": f"{loss:.5f}",
            "seconds": f"{seconds:.1f}",
        }
        _write_rows(out / "results.csv", list(rows.values()))
        print(f"{run_.name}: val loss {loss:.4f} ({seconds:.0f} s)", flush=True)

    for stage in (first, second):
        todo = [r for r in stage if r.name not in rows]
        todo.sort(key=lambda r: -SIZES[r.size]["hidden"] * r.tokens(args.tokens))  # longest first
        with ThreadPoolExecutor(args.jobs) as pool:
            futures = [pool.submit(_train, r, root, data, args.tokens) for r in todo]
            for future in as_completed(futures):
                record(future.result())
    settings = {"sizes": args.sizes, "seeds": args.seeds, "tokens": args.tokens, "jobs": args.jobs}
    write_result(out / "run.json", {**settings, "runs": len(rows)}, module="experiments.ternarize")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m experiments.ternarize", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sizes", nargs="+", default=["64x2", "128x4"], choices=list(SIZES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--tokens", type=int, default=524_288, help="D, the total budget of every arm")
    parser.add_argument("--jobs", type=int, default=2, help="runs trained at once (one thread each)")
    parser.add_argument("--root", default="runs/ternarize", help="where the run directories go")
    parser.add_argument("--out", default=str(OUT), help="where results.csv is written")
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
