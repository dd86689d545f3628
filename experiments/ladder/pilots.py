"""The ladder's pilot tables and plot, from the pilot runs' own directories (``pilots.md`` quotes them).

    python -m experiments.ladder.pilots runs/pilots/p1 runs/ladder/sweep --out docs/results/ladder

Every run directory found under the given folders (one with ``resolved_config.yaml`` and
``logs/metrics.jsonl``) becomes a row: family, width × depth, batch tokens, peak learning rate, warm-up,
training tokens, the validation loss at 0.26M, 0.52M and 1.05M tokens (when the run reached them) and at its
end, the wall time between its first and last metrics record, and whether it finished. Rows are grouped by
(family, shape, tokens). ``pilot_curves.png`` plots validation loss against tokens for the 128-wide FloatLM
runs: each batch size at its best rate (5 % warm-up), and each warm-up length at batch 1,024.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

MARKS = (262_144, 524_288, 1_048_576)


def read_run(run_dir: Path) -> dict | None:
    config, metrics = run_dir / "resolved_config.yaml", run_dir / "logs" / "metrics.jsonl"
    if not (config.is_file() and metrics.is_file()):
        return None
    cfg = yaml.safe_load(config.read_text())
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    batch = int(cfg["batch_tokens"])
    steps = int(cfg["tokens"]) // batch
    vals = {r["step"] * batch: r["val_loss"] for r in records if "val_loss" in r}
    times = [r["time"] for r in records if "time" in r]
    model = cfg["model"]
    warm = cfg["schedule"]["warmup"]
    return {
        "name": run_dir.name,
        "family": model["family"],
        "shape": f"{model['hidden']}x{model['layers']}",
        "batch": batch,
        "lr": float(cfg["optim"]["lr"]),
        "warmup": f"{warm:g}" if warm < 1 else f"{int(warm)} steps",
        "tokens": steps * batch,
        "vals": vals,
        "final": vals.get(steps * batch),
        "wall_s": (max(times) - min(times)) if len(times) > 1 else None,
        "finished": steps * batch in vals,
    }


def collect(folders: list[Path]) -> list[dict]:
    runs = []
    for folder in folders:
        for path in sorted(folder.iterdir()) if folder.is_dir() else []:
            if path.is_dir() and not (path / "SKIPPED").exists():
                run = read_run(path)
                if run is not None:
                    runs.append(run)
    return sorted(
        runs, key=lambda r: (r["family"], int(r["shape"].split("x")[0]), r["tokens"], r["batch"], r["lr"])
    )


def render(runs: list[dict]) -> str:
    head = ["family", "shape", "batch", "lr", "warm-up", "tokens", *[f"loss @{m / 1e6:.2f}M" for m in MARKS]]
    head += ["final", "wall"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        marks = [f"{r['vals'][m]:.4f}" if m in r["vals"] else "–" for m in MARKS]
        final = f"{r['final']:.4f}" if r["finished"] else "(running)"
        wall = f"{r['wall_s'] / 60:.0f} min" if r["wall_s"] else "–"
        cells = [r["family"], r["shape"], f"{r['batch']:,}", f"{r['lr']:g}", r["warmup"], f"{r['tokens']:,}"]
        lines.append("| " + " | ".join([*cells, *marks, final, wall]) + " |")
    return "\n".join(lines)


def _curve(ax, run: dict, label: str) -> None:
    xs = sorted(t for t in run["vals"] if t >= 16 * run["batch"])
    ax.plot(xs, [run["vals"][t] for t in xs], "o-", ms=3, label=label)


def plot(runs: list[dict], out: Path) -> None:
    """Left: the best rate of each batch size at 5 % warm-up. Right: warm-up lengths at batch 1,024."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.5))
    left, right = fig.subplots(1, 2, sharey=True)
    base = [
        r
        for r in runs
        if r["family"] == "floatlm" and r["shape"] == "128x4" and r["finished"] and r["tokens"] == 1_048_576
    ]
    at5 = [r for r in base if r["warmup"] == "0.05"]
    for batch in sorted({r["batch"] for r in at5}):
        best = min((r for r in at5 if r["batch"] == batch), key=lambda r: r["final"])
        _curve(left, best, f"batch {batch:,} tokens (lr {best['lr']:g})")
    left.set_title("FloatLM 128x4, 5 % warm-up: batch size (best rate of each)", fontsize=10)
    for warm in sorted({r["warmup"] for r in base if r["batch"] == 1024}, key=float):
        chosen = [r for r in base if r["batch"] == 1024 and r["warmup"] == warm and r["lr"] == 0.004]
        if chosen:
            _curve(right, chosen[0], f"warm-up {float(warm) * 100:g} % (lr 0.004)")
    right.set_title("FloatLM 128x4, batch 1,024: warm-up length", fontsize=10)
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel("training tokens")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    left.set_ylabel("validation loss (nats/token)")
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(out / f"pilot_curves.{ext}", dpi=150 if ext == "png" else None, bbox_inches="tight")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", type=Path, help="folders of pilot run directories")
    p.add_argument("--out", type=Path, default=None, help="write pilot_curves.png/svg here")
    args = p.parse_args()
    runs = collect(args.folders)
    print(render(runs))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        plot(runs, args.out)
        print(f"\nwrote {args.out / 'pilot_curves.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
