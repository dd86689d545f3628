"""The ladder's rate sweeps and the μP check: final loss against peak rate, per family and size.

    python -m experiments.ladder.sweeps --out docs/results/ladder

Reads the finished runs under ``runs/ladder/sweep`` (the ladder: every family × size × rate on the full
budget) and ``runs/ladder-mup/sweep`` (FloatLM at depth 4, widths 64/128/192, standard parametrization and μP
with base width 64; the ladder's own FloatLM 128x4 and 192x4 runs are its standard-parametrization points).
Prints two markdown tables (``report.py`` puts them in ``README.md``) and writes ``sweeps.png`` and
``mup.png``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

NAMES = {"floatlm": "FloatLM", "trilm": "TriLM", "bilm": "BiLM"}


def final_loss(run_dir: Path) -> dict | None:
    """The run's config facts and its validation loss at the last step (None when it has not finished)."""
    config, metrics = run_dir / "resolved_config.yaml", run_dir / "logs" / "metrics.jsonl"
    if not (config.is_file() and metrics.is_file()):
        return None
    cfg = yaml.safe_load(config.read_text())
    steps = int(cfg["tokens"]) // int(cfg["batch_tokens"])
    vals = {}
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        if "val_loss" in record:
            vals[record["step"]] = record["val_loss"]
    if steps not in vals:
        return None
    model = cfg["model"]
    return {
        "dir": run_dir.name,
        "family": model["family"],
        "shape": f"{model['hidden']}x{model['layers']}",
        "width": model["hidden"],
        "lr": float(cfg["optim"]["lr"]),
        "mup": int(model.get("mup_base_width") or 0),
        "tokens": int(cfg["tokens"]),
        "batch": int(cfg["batch_tokens"]),
        "warmup": float(cfg["schedule"]["warmup"]),
        "loss": vals[steps],
    }


def collect(folder: Path, tokens: int = 2_097_152) -> list[dict]:
    runs = [final_loss(p) for p in sorted(folder.glob("*")) if p.is_dir()] if folder.is_dir() else []
    return [r for r in runs if r and r["tokens"] == tokens and r["batch"] == 1024 and r["warmup"] == 0.15]


def grid(runs: list[dict], rows: list[tuple[str, str]], key) -> str:
    """Markdown: one row per (label, selector), one column per rate; the best of each row in bold."""
    rates = sorted({r["lr"] for r in runs})
    lines = [
        "| run | " + " | ".join(f"lr {lr:g}" for lr in rates) + " | best |",
        "|---" * (len(rates) + 2) + "|",
    ]
    for label, selector in rows:
        mine = {r["lr"]: r["loss"] for r in runs if key(r) == selector}
        if not mine:
            continue
        best = min(mine, key=mine.get)
        cells = [
            ("**" if lr == best else "") + f"{mine[lr]:.4f}" + ("**" if lr == best else "")
            if lr in mine
            else "–"
            for lr in rates
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {best:g} |")
    return "\n".join(lines)


def plot_sweeps(runs: list[dict], out: Path) -> None:
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    fams = [f for f in NAMES if any(r["family"] == f for r in runs)]
    fig = Figure(figsize=(5 * len(fams), 4.2))
    axes = fig.subplots(1, len(fams), sharey=True, squeeze=False)[0]
    shapes = sorted({r["shape"] for r in runs}, key=lambda s: int(s.split("x")[0]))
    cmap = colormaps["viridis"]
    for ax, fam in zip(axes, fams):
        for i, shape in enumerate(shapes):
            pts = sorted((r["lr"], r["loss"]) for r in runs if r["family"] == fam and r["shape"] == shape)
            if pts:
                ax.plot(
                    *zip(*pts), "o-", ms=4, color=cmap(0.1 + 0.8 * i / max(len(shapes) - 1, 1)), label=shape
                )
        ax.set_xscale("log")
        ax.set_xlabel("peak learning rate")
        ax.set_title(f"{NAMES[fam]}: final loss against rate", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, title="size", title_fontsize=7)
    axes[0].set_ylabel("validation loss (nats/token)")
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(out / f"sweeps.{ext}", dpi=150 if ext == "png" else None, bbox_inches="tight")


def plot_mup(points: list[dict], out: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.2))
    axes = fig.subplots(1, 2, sharey=True)
    panels = (
        (axes[0], False, "standard parametrization", [p for p in points if not p["mup"]]),
        (axes[1], True, "μP, base width 64", [p for p in points if p["mup"] or p["width"] == 64]),
    )
    for ax, mup, title, chosen in panels:
        for width in sorted({p["width"] for p in chosen}):
            pts = sorted((p["lr"], p["loss"]) for p in chosen if p["width"] == width)
            ax.plot(*zip(*pts), "o-", ms=4, label=f"width {width}")
        ax.set_xscale("log")
        ax.set_xlabel("peak learning rate (μP: at the base width)" if mup else "peak learning rate")
        ax.set_title(f"FloatLM, depth 4: {title}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("validation loss (nats/token)")
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(out / f"mup.{ext}", dpi=150 if ext == "png" else None, bbox_inches="tight")


def ladder_table(ladder: list[dict]) -> str:
    """Final loss by rate, one row per (family, size) of the ladder."""
    shapes = sorted({r["shape"] for r in ladder}, key=lambda s: int(s.split("x")[0]))
    rows = [(f"{NAMES[f]} {s}", (f, s)) for f in NAMES for s in shapes]
    return grid(ladder, rows, key=lambda r: (r["family"], r["shape"]))


def mup_points(ladder: list[dict], mup: list[dict]) -> list[dict]:
    """The μP check's runs plus the ladder's FloatLM 128x4 and 192x4 (its standard-parametrization points)."""
    return mup + [r for r in ladder if r["family"] == "floatlm" and r["shape"] in ("128x4", "192x4")]


def mup_table(points: list[dict]) -> str:
    rows = [
        (f"{'μP' if m else 'SP'} width {w}", (w, m))
        for m in (0, 64)
        for w in sorted({r["width"] for r in points})
        if not (m and w == 64)
    ]
    return grid(points, rows, key=lambda r: (r["width"], r["mup"]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ladder", type=Path, default=Path("runs/ladder/sweep"))
    p.add_argument("--mup", type=Path, default=Path("runs/ladder-mup/sweep"))
    p.add_argument("--out", type=Path, default=None, help="write sweeps.png and mup.png here")
    args = p.parse_args()
    ladder = collect(args.ladder)
    print("## Final loss by rate (ladder)\n")
    print(ladder_table(ladder))
    points = mup_points(ladder, collect(args.mup))
    print("\n## FloatLM at depth 4: standard parametrization (SP) and μP (base width 64)\n")
    print(mup_table(points))
    print("\n(μP at width 64 is the standard parametrization: the same runs.)")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        plot_sweeps(ladder, args.out)
        plot_mup(points, args.out)
        print(f"\nwrote {args.out / 'sweeps.png'} and {args.out / 'mup.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
