"""The crossover grid: at which tokens per non-embedding parameter D/N converting a FloatLM beats a TriLM
trained from scratch on the same total tokens D.

For each size (N non-embedding parameters), budget D = D/N · N (rounded to whole batches) and seed:

- ``trilm``: a TriLM from scratch for D tokens, at the TriLM's best rate for the size (the reference);
- ``floatlm-pre``: a FloatLM for (1 − f)·D tokens on its own cosine schedule (warm-up and decay complete),
  at the FloatLM's best rate; ``trilm-conv``: that FloatLM continued as a TriLM for f·D tokens (the plain
  conversion: ``init_from`` across families, a fresh optimizer);
- ``floatlm-stable``: a FloatLM for 0.9·D tokens at its best rate held constant after the warm-up (the
  stable phase of a WSD run of D tokens; its snapshot at (1 − f)·D is the cooldown start of every
  f); ``trilm-cool``: the snapshot at the cooldown start continued as a TriLM for the last f·D tokens,
  the conversion taking the place of the float run's cooldown (``init_from``: a fresh optimizer, its own
  data order); ``trilm-branch``: the same as a conversion branch (``branch_from`` the stable run's state
  at the cooldown start: its AdamW moments kept or reset, its data order continued).

Every conversion uses one recipe (:data:`RECIPES`), chosen by a sweep at one point (:data:`RECIPE_POINT`,
plain conversions, both f, two seeds) and then held fixed; a branch keeps or resets the moments as the
same point's branches (both f, two seeds) found better. The best rates come from a sweep of
:data:`RATES` at D/N = 50, seed 1, for each family and size. Nothing of that is typed in by hand: the
driver reads the sweeps' rows as they land, and the grid's runs are defined once the sweeps they need are
complete (``--recipe`` pins the recipe instead).

Runs are trained one at a time (``--jobs``), the cheapest ready one first: the sweeps at the recipe's
point, then the grid's points in order of their budget D (another size's rate sweep at its own budget),
each point's sources before its conversions, so complete points land early. Every finished run is a row
of ``crossover.csv`` (written as it ends); rerunning trains only what is missing.
``python -m experiments.ternarize.report`` turns the rows into the gap against D/N.

    python -m experiments.ternarize crossover [--sizes 16x2 32x2] [--dn 5 15 50 150 500] [--seeds 1 2 3]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import CHECKOUT, write_result
from experiments.ternarize.run import OUT, train_in_subprocess, val_loss

SIZES: dict[str, dict[str, int]] = {
    "16x2": {"hidden": 16, "ffn": 64, "heads": 1, "layers": 2},
    "32x2": {"hidden": 32, "ffn": 128, "heads": 1, "layers": 2},
    "64x2": {"hidden": 64, "ffn": 192, "heads": 2, "layers": 2},
}
"""The two smallest CPU shapes (32x2 is the ladder's smallest; 16x2 halves its width, FFN 4x the width),
context 128, and 64x2 (the ladder's second) for later sessions."""
DEFAULT_SIZES = ("16x2", "32x2")
DN = (5, 15, 50, 150, 500)
"""Tokens per non-embedding parameter, half a decade apart."""
FRACTIONS = (0.1, 0.25)
SEEDS = (1, 2, 3)
BATCH_TOKENS = 1024
WARMUP = 0.15
"""The ladder's warm-up share (docs/results/ladder/pilots.md), for every run from scratch."""
RATE_POINT = 50
"""The D/N of the rate sweep (seed 1)."""
RATES: dict[str, tuple[float, ...]] = {
    "16x2": (4e-3, 8e-3, 1.6e-2, 3.2e-2),
    "32x2": (4e-3, 8e-3, 1.6e-2, 3.2e-2),
    "64x2": (4e-3, 8e-3),
}
"""Peak rates tried per size, for TriLM and FloatLM alike. The ladder (2M tokens) tried only 4e-3 at 32x2
and found 4e-3 best at 64x2 at the edge of what it tried, so both go higher; 16x2 is not in the ladder."""
RECIPE_POINT = ("16x2", 50)
RECIPE_SEEDS = (1, 2)
RECIPES: dict[str, dict[str, Any]] = {
    "spectra": {"ratio": 1.0, "schedule": "spectra", "distill": None},
    **{
        f"r{ratio:g}" + (f"-kd{tau:g}" if tau else ""): {
            "ratio": ratio,
            "schedule": "cosine0",
            "distill": tau,
        }
        for ratio in (1.0, 0.5, 0.25)
        for tau in (None, 1.0, 5.0)
    },
    "r1-kd1-ramp0.1": {"ratio": 1.0, "schedule": "cosine0", "distill": 1.0, "ramp": (0.1, "linear")},
    "r1-kd1-ramp0.25s": {"ratio": 1.0, "schedule": "cosine0", "distill": 1.0, "ramp": (0.25, "sigmoid")},
}
"""The conversion recipes of the sweep. ``ratio``: the conversion's peak rate over its source's.
``spectra``: the TriLM recipe's schedule (5 % warm-up, rate halved at ½, weight decay 0.1 off at ⅔), the
split experiment's; ``cosine0``: no warm-up, cosine to 0, no weight decay (ParetoQ's). ``distill``: the
temperature of logit distillation from the source (weight ½), or none. ``ramp``: a λ ramp (its share of
the conversion's steps and shape, ``convert.ramp``), tried on the best recipe of the first ten."""
OPTIMIZERS = ("keep", "reset")
"""A conversion branch's AdamW moments (``convert.optimizer``)."""
CONVERSION_DATA_SEED = 1000
"""Added to the seed for a conversion's data order: a conversion starts the sampler at sample 0, and with
the source's own seed it would see again exactly the first tokens its source saw."""
FIELDS = [
    "run",
    "size",
    "nonemb",
    "dn",
    "budget",
    "seed",
    "arm",
    "fraction",
    "recipe",
    "lr",
    "tokens",
    "val_loss",
    "seconds",
    "finished",
]


def nonembedding(size: str) -> int:
    """N, the size's non-embedding parameters (block linears and norms)."""
    from trilm.model.config import preset
    from trilm.model.flops import parameter_counts

    cfg = preset("trilm-nano", vocab_size=2048, context=128, **SIZES[size])
    return parameter_counts(cfg).nonembedding


def budget(size: str, dn: float) -> int:
    """D in tokens: D/N · N rounded to whole batches."""
    return max(1, round(dn * nonembedding(size) / BATCH_TOKENS)) * BATCH_TOKENS


def conversion_tokens(total: int, fraction: float) -> int:
    """f·D in whole batches (at least one); the source then trains D minus that, so totals are equal."""
    return max(1, round(fraction * total / BATCH_TOKENS)) * BATCH_TOKENS


@dataclasses.dataclass(frozen=True)
class Run:
    size: str
    dn: float
    seed: int
    arm: str
    """``trilm``, ``floatlm``, ``floatlm-pre``, ``floatlm-stable``, ``trilm-conv`` or ``trilm-cool``."""
    lr: float
    """The run's peak rate; for a conversion, its source's (the recipe scales it)."""
    fraction: float = 0.0
    recipe: str = ""
    optimizer: str = ""
    """A branch's moments: ``keep`` or ``reset``."""

    @property
    def budget(self) -> int:
        return budget(self.size, self.dn)

    @property
    def name(self) -> str:
        head = {"floatlm-pre": f"floatlm-pre{self.fraction:g}", "trilm-conv": f"trilm-conv{self.fraction:g}"}
        head["trilm-cool"] = f"trilm-cool{self.fraction:g}"
        head["trilm-branch"] = f"trilm-branch{self.fraction:g}"
        tag = head.get(self.arm, self.arm) + (f"-{self.recipe}" if self.recipe else "")
        tag += f"-{self.optimizer}" if self.optimizer else ""
        return f"{tag}-lr{self.lr:g}-{self.size}-d{self.dn:g}-s{self.seed}"

    @property
    def tokens(self) -> int:
        if self.arm in ("trilm", "floatlm"):
            return self.budget
        if self.arm == "floatlm-pre":
            return self.budget - conversion_tokens(self.budget, self.fraction)
        if self.arm == "floatlm-stable":
            return self.budget - conversion_tokens(self.budget, min(FRACTIONS))
        return conversion_tokens(self.budget, self.fraction)

    @property
    def family(self) -> str:
        return "floatlm" if self.arm.startswith("floatlm") else "trilm"

    @property
    def source(self) -> Run | None:
        """The FloatLM a conversion starts from."""
        if self.arm == "trilm-conv":
            return Run(self.size, self.dn, self.seed, "floatlm-pre", self.lr, self.fraction)
        if self.arm in ("trilm-cool", "trilm-branch"):
            return Run(self.size, self.dn, self.seed, "floatlm-stable", self.lr)
        return None

    @property
    def final_step(self) -> int:
        """The step of the run's last snapshot: a branch counts its steps from its parent's beginning."""
        return (self.budget if self.arm == "trilm-branch" else self.tokens) // BATCH_TOKENS

    @property
    def run_lr(self) -> float:
        """The peak rate the run trains at."""
        return self.lr * RECIPES[self.recipe]["ratio"] if self.recipe else self.lr


def source_snapshot(root: Path, run: Run) -> Path:
    """The snapshot a conversion starts from: its source's final one, or the stable run's at (1 − f)·D."""
    source = run.source
    assert source is not None
    step = (run.budget - run.tokens) // BATCH_TOKENS
    return root / source.name / "snapshots" / f"step-{step}"


def run_config(run: Run, root: Path, data: dict[str, Path]) -> dict[str, Any]:
    """The run's TrainConfig as a dict: the quickstart recipe of its family at the ladder's batch and
    warm-up, or for a conversion the recipe's schedule from its source's snapshot."""
    cfg = yaml.safe_load((CHECKOUT / "configs" / "train" / f"quickstart-{run.family}.yaml").read_text())
    steps = run.tokens // BATCH_TOKENS
    cfg.update(
        run_dir=str(root / run.name),
        seed=run.seed,
        model={"preset": f"{run.family}-nano", "vocab_size": 2048, "context": 128, **SIZES[run.size]},
        tokens=run.tokens,
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
    cfg["optim"] = {**cfg.get("optim", {}), "lr": run.run_lr}
    cfg["schedule"] = {**cfg["schedule"], "warmup": WARMUP}
    if run.arm == "floatlm-stable":
        warmup_steps = max(1, round(WARMUP * run.budget / BATCH_TOKENS))
        cfg["schedule"] = {"kind": "decay", "decay": "constant", "warmup": warmup_steps}
        cfg["checkpoint"]["keep_states_at"] = [
            (run.budget - conversion_tokens(run.budget, f)) // BATCH_TOKENS
            for f in FRACTIONS
            if f != min(FRACTIONS)
        ]
    source = run.source
    if run.arm == "trilm-branch":
        return branch_config(run, root, cfg)
    if source is not None:
        recipe = RECIPES[run.recipe]
        snapshot = str(source_snapshot(root, run))
        cfg["init_from"] = snapshot
        cfg["model"] = {"family": "trilm"}
        cfg["data"]["seed"] = run.seed + CONVERSION_DATA_SEED
        cfg["convert"] = {"recipe": "as_written"}  # each recipe of the sweep is its config, all of it
        if recipe["schedule"] == "spectra":
            cfg["schedule"] = {**cfg["schedule"], "warmup": 0.05}
        else:
            cfg["schedule"] = {"kind": "decay", "decay": "cosine", "warmup": 0}
            cfg["optim"].update(min_lr_ratio=0.0, weight_decay=0.0)
        if recipe["distill"]:
            cfg["distill"] = {"teacher": snapshot, "weight": 0.5, "temperature": recipe["distill"]}
        if recipe.get("ramp"):
            cfg["convert"].update(ramp=recipe["ramp"][0], ramp_shape=recipe["ramp"][1])
    return cfg


def branch_config(run: Run, root: Path, own: dict[str, Any]) -> dict[str, Any]:
    """A conversion branch's config: its parent's (the stable FloatLM's resolved config, as the branch
    check wants it) with the TriLM family, the whole budget's length, the recipe's schedule over the
    branch's own steps, its rate as ``convert.lr_scale`` of the parent's, and this run's checkpoints."""
    assert run.source is not None
    recipe = RECIPES[run.recipe]
    parent = yaml.safe_load((root / run.source.name / "resolved_config.yaml").read_text())
    step = (run.budget - run.tokens) // BATCH_TOKENS
    cfg = {k: v for k, v in parent.items() if k not in ("init_from", "distill", "convert")}
    cfg.update(
        run_dir=own["run_dir"],
        model={**parent["model"], "family": "trilm", "name": own["model"]["preset"]},
        tokens=run.budget,
        branch_from=str(root / run.source.name / "state" / f"step-{step}"),
        checkpoint={**own["checkpoint"], "snapshot_every": run.final_step, "state_every": run.final_step},
        log=own["log"],
    )
    cfg["model"].pop("quant", None)
    convert: dict[str, Any] = {
        "recipe": "as_written",
        "lr_scale": recipe["ratio"],
        "optimizer": run.optimizer or "keep",
    }
    if recipe.get("ramp"):
        convert.update(ramp=recipe["ramp"][0], ramp_shape=recipe["ramp"][1])
    cfg["convert"] = convert
    if recipe["schedule"] == "spectra":
        cfg["schedule"] = {**own["schedule"], "warmup": 0.05}
        cfg["optim"] = {**parent["optim"], "weight_decay": own["optim"]["weight_decay"]}
    else:
        cfg["schedule"] = {"kind": "decay", "decay": "cosine", "warmup": 0}
        cfg["optim"] = {**parent["optim"], "min_lr_ratio": 0.0, "weight_decay": 0.0}
    if recipe["distill"]:
        teacher = str(source_snapshot(root, run))
        cfg["distill"] = {"teacher": teacher, "weight": 0.5, "temperature": recipe["distill"]}
    return cfg


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
        writer.writerows(sorted(rows, key=lambda r: (r["size"], float(r["dn"]), int(r["seed"]), r["run"])))
    tmp.replace(path)


def _loss(rows: dict[str, dict[str, Any]], run: Run) -> float | None:
    row = rows.get(run.name)
    return float(row["val_loss"]) if row else None


def best_rate(rows: dict[str, dict[str, Any]], family: str, size: str) -> float | None:
    """The rate of the lowest loss in the size's rate sweep; None until every rate of it has a row."""
    losses = {lr: _loss(rows, Run(size, RATE_POINT, min(SEEDS), family, lr)) for lr in RATES[size]}
    if any(v is None for v in losses.values()):
        return None
    return min(losses, key=lambda lr: losses[lr])  # type: ignore[arg-type,return-value]


def recipe_losses(rows: dict[str, dict[str, Any]], float_lr: float) -> dict[str, list[float]]:
    """Per recipe, the sweep point's conversion losses (both f, the sweep's seeds) finished so far."""
    size, dn = RECIPE_POINT
    out: dict[str, list[float]] = {}
    for recipe in RECIPES:
        out[recipe] = [
            loss
            for f in FRACTIONS
            for seed in RECIPE_SEEDS
            if (loss := _loss(rows, Run(size, dn, seed, "trilm-conv", float_lr, f, recipe))) is not None
        ]
    return out


def chosen_recipe(rows: dict[str, dict[str, Any]], pinned: str | None) -> str | None:
    """The pinned recipe, or the sweep's lowest mean conversion loss once every recipe has all its rows."""
    if pinned:
        return pinned
    float_lr = best_rate(rows, "floatlm", RECIPE_POINT[0])
    if float_lr is None:
        return None
    losses = recipe_losses(rows, float_lr)
    if any(len(v) < len(FRACTIONS) * len(RECIPE_SEEDS) for v in losses.values()):
        return None
    return min(losses, key=lambda r: sum(losses[r]) / len(losses[r]))


def branch_losses(rows: dict[str, dict[str, Any]], float_lr: float, recipe: str) -> dict[str, list[float]]:
    """Per moment choice, the sweep point's branch losses (both f, the sweep's seeds) finished so far."""
    size, dn = RECIPE_POINT
    return {
        opt: [
            loss
            for f in FRACTIONS
            for seed in RECIPE_SEEDS
            if (loss := _loss(rows, Run(size, dn, seed, "trilm-branch", float_lr, f, recipe, opt)))
            is not None
        ]
        for opt in OPTIMIZERS
    }


def chosen_optimizer(rows: dict[str, dict[str, Any]], recipe: str | None) -> str | None:
    """``keep`` or ``reset``, whichever gave the lower mean branch loss at the sweep point; None until
    both have all their rows."""
    float_lr = best_rate(rows, "floatlm", RECIPE_POINT[0])
    if float_lr is None or recipe is None:
        return None
    losses = branch_losses(rows, float_lr, recipe)
    if any(len(v) < len(FRACTIONS) * len(RECIPE_SEEDS) for v in losses.values()):
        return None
    return min(losses, key=lambda o: sum(losses[o]) / len(losses[o]))


def wanted(
    rows: dict[str, dict[str, Any]], sizes: list[str], dns: list[float], seeds: list[int], pinned: str | None
) -> list[tuple[tuple[Any, ...], Run]]:
    """Every run defined by what has finished, with its priority (lower first): the rate sweep of the
    recipe's size, the recipe sweep, then the grid by budget D, seed and size, sources before conversions,
    with the other sizes' rate sweeps queued at their budget."""
    out: list[tuple[tuple[Any, ...], Run]] = []
    for size in sizes:
        for family in ("trilm", "floatlm"):
            for lr in RATES[size]:
                run = Run(size, RATE_POINT, min(SEEDS), family, lr)
                first = size == RECIPE_POINT[0]  # the recipe sweep waits for it; the others queue by D
                out.append(((0, run.tokens) if first else (2, run.budget, 0, size, 0), run))
    size, dn = RECIPE_POINT
    float_lr = best_rate(rows, "floatlm", size) if size in sizes else None
    if float_lr is not None:
        for seed in RECIPE_SEEDS:
            for f in FRACTIONS:
                pre = Run(size, dn, seed, "floatlm-pre", float_lr, f)
                out.append(((1, 0, pre.tokens), pre))
                if pre.name in rows:
                    for recipe in RECIPES:
                        run = Run(size, dn, seed, "trilm-conv", float_lr, f, recipe)
                        out.append(((1, 1, run.tokens), run))
            stable = Run(size, dn, seed, "floatlm-stable", float_lr)
            out.append(((1, 0, stable.tokens), stable))
    recipe = chosen_recipe(rows, pinned)
    if float_lr is not None and recipe is not None:
        for seed in RECIPE_SEEDS:
            if Run(size, dn, seed, "floatlm-stable", float_lr).name in rows:
                for f in FRACTIONS:
                    for opt in OPTIMIZERS:
                        run = Run(size, dn, seed, "trilm-branch", float_lr, f, recipe, opt)
                        out.append(((1, 2, run.tokens), run))
    optimizer = chosen_optimizer(rows, recipe)
    for size in sizes:
        tri, flt = best_rate(rows, "trilm", size), best_rate(rows, "floatlm", size)
        for dn in dns:
            for seed in seeds:
                key = (2, budget(size, dn), seed, size)
                if tri is not None:
                    out.append(((*key, 0), Run(size, dn, seed, "trilm", tri)))
                if flt is None:
                    continue
                stable = Run(size, dn, seed, "floatlm-stable", flt)
                out.append(((*key, 0), stable))
                for f in FRACTIONS:
                    pre = Run(size, dn, seed, "floatlm-pre", flt, f)
                    out.append(((*key, 0), pre))
                    if recipe is None:
                        continue
                    if pre.name in rows:
                        out.append(((*key, 1), Run(size, dn, seed, "trilm-conv", flt, f, recipe)))
                    if stable.name in rows:
                        out.append(((*key, 1), Run(size, dn, seed, "trilm-cool", flt, f, recipe)))
                        if optimizer is not None:
                            branch = Run(size, dn, seed, "trilm-branch", flt, f, recipe, optimizer)
                            out.append(((*key, 1), branch))
    return out


def _train_here(run: Run, root: Path, data: dict[str, Path]) -> tuple[Run, float, str]:
    """Train in this process (one run at a time): a run of a few hundred steps costs less than the
    seconds a fresh interpreter spends importing the trainer."""
    import torch

    from trilm.train.config import TrainConfig
    from trilm.train.trainer import Trainer

    cfg = run_config(run, root, data)
    config = root / "configs" / f"{run.name}.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    torch.set_num_threads(1)
    started = time.perf_counter()
    try:
        Trainer(TrainConfig.from_dict(cfg)).fit()
    except Exception:  # a failed run is reported and skipped; the others go on
        return run, time.perf_counter() - started, traceback.format_exc()[-3000:]
    return run, time.perf_counter() - started, ""


def _train(run: Run, root: Path, data: dict[str, Path]) -> tuple[Run, float, str]:
    """Train in a subprocess of one thread (several runs at once)."""
    config = root / "configs" / f"{run.name}.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump(run_config(run, root, data), sort_keys=False))
    return (run, *train_in_subprocess(config))


def run(args: argparse.Namespace) -> None:
    from trilm.data.pipeline import prepare_embedded

    root, out = Path(args.root), Path(args.out)
    data = prepare_embedded(root / "data", vocab_size=2048, workers=1, progress=False)
    csv_path = out / "crossover.csv"
    rows = {r["run"]: r for r in read_rows(csv_path)}
    failed: set[str] = set()
    running: dict[Future, Run] = {}
    started = time.time()

    def record(run_: Run, seconds: float, error: str) -> None:
        if error:
            failed.add(run_.name)
            print(f"{run_.name}: FAILED\n{error}", file=sys.stderr, flush=True)
            return
        loss = val_loss(root / run_.name / "snapshots" / f"step-{run_.final_step}")
        rows[run_.name] = {
            "run": run_.name,
            "size": run_.size,
            "nonemb": nonembedding(run_.size),
            "dn": f"{run_.dn:g}",
            "budget": run_.budget,
            "seed": run_.seed,
            "arm": run_.arm,
            "fraction": run_.fraction,
            "recipe": run_.recipe + (f"-{run_.optimizer}" if run_.optimizer else ""),
            "lr": f"{run_.lr:g}",
            "tokens": run_.tokens,
            "val_loss": f"{loss:.5f}",
            "seconds": f"{seconds:.1f}",
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        _write_rows(csv_path, list(rows.values()))
        print(f"{run_.name}: val loss {loss:.4f} ({seconds:.0f} s)", flush=True)

    with ThreadPoolExecutor(args.jobs) as pool:
        while True:
            busy = {r.name for r in running.values()}
            todo = sorted(
                (p for p in wanted(rows, args.sizes, args.dn, args.seeds, args.recipe)),
                key=lambda p: p[0],
            )
            todo = [
                (p, r) for p, r in todo if r.name not in rows and r.name not in failed and r.name not in busy
            ]
            seen: set[str] = set()
            for _, r in todo:
                if len(running) >= args.jobs:
                    break
                if r.name in seen:
                    continue
                seen.add(r.name)
                running[pool.submit(_train_here if args.jobs == 1 else _train, r, root, data)] = r
            if not running:
                break
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for future in done:
                running.pop(future)
                record(*future.result())
            if args.hours and time.time() - started > args.hours * 3600:
                print(f"stopping: --hours {args.hours} reached (running runs finish first)", flush=True)
                for future in list(running):
                    record(*future.result())
                break
    if args.jobs == 1:
        from trilm.parallel import shutdown_parallel

        shutdown_parallel()
    settings = {"sizes": args.sizes, "dn": args.dn, "seeds": args.seeds, "recipe": args.recipe}
    train_tokens = json.loads((data["train"] / "index.json").read_text())["num_tokens"]
    write_result(
        out / "crossover-run.json",
        {**settings, "train_tokens": train_tokens, "runs": len(rows), "failed": sorted(failed)},
        module="experiments.ternarize crossover",
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.ternarize crossover", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sizes", nargs="+", default=list(DEFAULT_SIZES), choices=list(SIZES))
    parser.add_argument("--dn", nargs="+", type=float, default=list(DN), help="tokens per parameter D/N")
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    parser.add_argument(
        "--recipe", choices=list(RECIPES), help="pin the conversion recipe (default: the sweep's)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="runs trained at once (one thread each)")
    parser.add_argument(
        "--hours", type=float, default=0, help="start no run after this many hours (0: no limit)"
    )
    parser.add_argument("--root", default="runs/ternarize-crossover", help="where the run directories go")
    parser.add_argument("--out", default=str(OUT), help="where crossover.csv is written")
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
