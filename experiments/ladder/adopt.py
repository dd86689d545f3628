"""Adopt the best learning rate of each (family, size) from the ladder's sweep as the ladder's run.

    python -m experiments.ladder.adopt          # print the choice and the suite-file snippet
    python -m experiments.ladder.adopt --copy   # also copy each winner to <root>/<family>-<size>

The sweep (``trilm suite sweep ladder --size S --lr …``) trains every (family, size, rate) of the ladder
on the ladder's full budget under ``<root>/sweep/<family>-<size>-lr<rate>``. A run of the suite at the
winning rate is that same run: the same config apart from its directory, and training on a CPU is
deterministic, so ``trilm suite launch ladder`` with the rates in ``configs/suites/ladder.yaml`` trains it
again bit for bit (``README.md`` shows one such check). ``--copy`` saves that second training by copying
the winner's directory into the suite's place; its snapshots keep the sweep run's name, which carries the
rate.
"""

from __future__ import annotations

import argparse
import shutil

from trilm.suite import load_suite
from trilm.suite.status import run_status
from trilm.suite.sweep import SweepPoint


def candidates(suite, run) -> list[SweepPoint]:
    """Finished sweep runs of ``run`` (same family and size, no extra axes, the suite's budget)."""
    import dataclasses

    out = []
    for path in sorted((suite.root / "sweep").glob(f"{run.name}-lr*")):
        rate = path.name[len(run.name) + 3 :]
        try:
            lr = float(rate)
        except ValueError:
            continue  # a run with extra axes (batch, warm-up, seed): not a candidate
        cfg = run.cfg.with_overrides([f"optim.lr={lr!r}", f"run_dir={path}"])
        point = SweepPoint(dataclasses.replace(run, name=path.name, cfg=cfg), run.family, lr)
        if run_status(point.run).state == "finished":
            out.append(point)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default="ladder")
    p.add_argument("--run-dir", default=None, help="the suite's root (default: its own)")
    p.add_argument("--copy", action="store_true", help="copy each winner to <root>/<family>-<size>")
    args = p.parse_args()
    suite = load_suite(args.suite, families=["trilm", "floatlm", "bilm"], root=args.run_dir)
    chosen: dict[str, dict[str, float]] = {}
    for run in suite.runs:
        points = candidates(suite, run)
        if not points:
            print(f"{run.name:16s} no finished sweep run")
            continue
        losses = {p.lr: run_status(p.run).val_loss for p in points}
        best = min(losses, key=losses.get)
        rates = sorted(losses)
        edge = " (best at the edge of the grid)" if best in (rates[0], rates[-1]) and len(rates) > 1 else ""
        cells = "  ".join(f"{lr:g}: {losses[lr]:.4f}" for lr in rates)
        print(f"{run.name:16s} {cells}   best {best:g}{edge}")
        chosen.setdefault(run.size, {})[run.family] = best
        target = run.run_dir
        if args.copy and not target.exists():
            winner = next(p for p in points if p.lr == best)
            shutil.copytree(winner.run.run_dir, target, symlinks=True)
            print(f"{'':16s} copied {winner.run.run_dir} → {target}")
    print("\n# sizes' family_overrides for the suite file:")
    for size, rates in chosen.items():
        inner = ", ".join(f"{fam}: {{optim: {{lr: {lr:g}}}}}" for fam, lr in rates.items())
        print(f"#   {size}: family_overrides: {{{inner}}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
