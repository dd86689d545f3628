"""``trilm quickstart`` (what ``make quickstart`` runs): the whole job in minutes on a CPU.

1. tokenizer + packed shards of the embedded corpus (``trilm data``),
2. a tiny TriLM and its FloatLM twin trained with the Spectra schedule, each writing its checkpoint suite,
3. validation loss per checkpoint and a generated sample from each final model,
4. the scaling-law analysis of the tiny suite (fits, report, plots).

Rerunning it reuses what is finished: prepared shards, completed runs (they resume, and a finished run has
nothing left to do).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "train"
PROMPTS = ("In the beginning", "The Python interpreter")


def build_parser(parser: argparse.ArgumentParser, command: str = "quickstart") -> None:
    parser.add_argument("--run-dir", default="runs/quickstart", help="where data, runs and analysis go")
    parser.add_argument(
        "--tokens", type=int, default=None, help="training tokens per model (default: config)"
    )
    parser.add_argument("--families", default="trilm,floatlm", help="comma-separated, from trilm,floatlm")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def _train(family: str, root: Path, data: dict, tokens: int | None, progress: bool):
    from trilm.train.config import TrainConfig
    from trilm.train.trainer import Trainer

    path = CONFIG_DIR / f"quickstart-{family}.yaml"
    overrides = [
        f"run_dir={root / f'{family}-tiny'}",
        f"data.train_dir={data['train']}",
        f"data.valid_dir={data['validation']}",
        f"data.tokenizer={data['tokenizer']}",
        f"log.progress={str(progress).lower()}",
    ]
    if tokens:
        overrides.append(f"tokens={tokens}")
    cfg = TrainConfig.from_yaml(path, overrides)
    return cfg, Trainer(cfg).fit()


def _loss_table(summaries: dict) -> str:
    steps = sorted({s for _, summary in summaries.values() for s in summary.val_losses})
    families = list(summaries)
    head = f"{'step':>6} {'tokens':>9}  " + "  ".join(f"{f:>10}" for f in families)
    lines = [head, "-" * len(head)]
    cfg = next(iter(summaries.values()))[0]
    for step in steps:
        row = f"{step:>6} {step * cfg.batch_tokens:>9,}  "
        row += "  ".join(
            f"{summaries[f][1].val_losses[step]:>10.4f}"
            if step in summaries[f][1].val_losses
            else f"{'':>10}"
            for f in families
        )
        lines.append(row)
    return "\n".join(lines)


def _samples(summaries: dict, tokenizer_path: str) -> str:
    from trilm.data.tokenizer import Tokenizer
    from trilm.serve import Engine, SamplingParams

    tok = Tokenizer.load(tokenizer_path)
    out = []
    for family, (cfg, summary) in summaries.items():
        snapshot = Path(summary.run_dir) / "snapshots" / f"step-{cfg.steps}"
        engine = Engine.load(snapshot, device="cpu", tokenizer=tok, max_batch=len(PROMPTS))
        params = SamplingParams(max_tokens=40, temperature=0.7, top_k=20, seed=0)
        for prompt, done in zip(PROMPTS, engine.generate(list(PROMPTS), params)):
            text = done.text.replace("\n", " ")
            out.append(f"[{family}] {prompt}{text}")
    return "\n".join(out)


def run(args) -> int:
    from trilm.data.pipeline import prepare_embedded
    from trilm.parallel import shutdown_parallel

    start = time.perf_counter()
    root = Path(args.run_dir)
    progress = not args.no_progress
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    print(f"== 1/4 data: tokenizer and packed shards of the embedded corpus → {root / 'data'}")
    data = prepare_embedded(root / "data", vocab_size=2048, workers=2, progress=progress)
    summaries = {}
    for i, family in enumerate(families):
        print(f"== 2/4 train {family} ({i + 1}/{len(families)}) → {root / f'{family}-tiny'}")
        summaries[family] = _train(family, root, data, args.tokens, progress)
    print("== 3/4 validation loss per checkpoint (nats/token)")
    print(_loss_table(summaries))
    print("\nsamples from the final checkpoints:")
    print(_samples(summaries, str(data["tokenizer"])))
    print(f"== 4/4 scaling analysis → {root / 'analysis'}")
    print(_analysis(root, summaries))
    shutdown_parallel()
    print(
        f"\nquickstart finished in {time.perf_counter() - start:.0f} s; runs, logs and analysis under {root}"
    )
    return 0


def _analysis(root: Path, summaries: dict) -> str:
    from trilm.eval.suite import write_suite_table
    from trilm.scaling import analyze

    table = root / "results.csv"
    added, skipped = write_suite_table([s.run_dir for _, s in summaries.values()], table)
    report = analyze([table], root / "analysis", bootstrap=200, seed=0)
    lines = [f"results table {table}: {added} rows added, {skipped} already there"]
    lines += [f"  {name}: {path}" for name, path in sorted(report.files.items())]
    lines += [f"  note: {note}" for note in report.notes]
    return "\n".join(lines)
