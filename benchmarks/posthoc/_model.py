"""The FloatLM that the post-hoc benchmarks compress, prepared once and reused.

``python -m benchmarks.posthoc._model --run-dir runs/posthoc`` tokenizes the embedded
corpus into ``RUN_DIR/data`` and trains ``configs/train/posthoc-floatlm.yaml`` into ``RUN_DIR/floatlm``.
Rerunning it reuses what is finished (prepared shards are kept, a finished run has nothing left to do, an
interrupted one resumes). Other benchmarks import :func:`prepare_posthoc_model` and get the paths back::

    from benchmarks.posthoc._model import prepare_posthoc_model
    model = prepare_posthoc_model("runs/posthoc")   # PosthocModel(snapshot=..., train=..., ...)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from benchmarks.common import CHECKOUT

CONFIGS = {
    "posthoc": CHECKOUT / "configs" / "train" / "posthoc-floatlm.yaml",
    "quickstart": CHECKOUT / "configs" / "train" / "quickstart-floatlm.yaml",
}
"""Which FloatLM: the post-hoc evidence model, or the quickstart's FloatLM-tiny on the same data."""
VOCAB_SIZE = 2048


@dataclasses.dataclass(frozen=True)
class PosthocModel:
    """Where the trained FloatLM and its data live."""

    run_dir: Path
    snapshot: Path
    """The final snapshot (``model.safetensors`` + ``config.json``)."""
    train: Path
    """Prepared train split (calibration windows come from here)."""
    validation: Path
    """Prepared validation split (perplexity is measured here)."""
    tokenizer: Path
    seq_len: int
    train_seconds: float | None
    """Wall time of the training call in this process (None when the run was already finished)."""


def train_config(
    run_dir: Path,
    data: dict[str, Path],
    tokens: int | None = None,
    progress: bool = True,
    model: str = "posthoc",
):
    """The model's TrainConfig with its paths pointed under ``run_dir`` (``floatlm`` or
    ``quickstart-floatlm``)."""
    from trilm.train.config import TrainConfig

    name = "floatlm" if model == "posthoc" else f"{model}-floatlm"
    overrides = [
        f"run_dir={run_dir / name}",
        f"data.train_dir={data['train']}",
        f"data.valid_dir={data['validation']}",
        f"data.tokenizer={data['tokenizer']}",
        f"log.progress={str(progress).lower()}",
    ]
    if tokens:
        overrides.append(f"tokens={tokens}")
    return TrainConfig.from_yaml(CONFIGS[model], overrides)


def prepare_posthoc_model(
    run_dir: str | Path = "runs/posthoc",
    *,
    tokens: int | None = None,
    progress: bool = True,
    model: str = "posthoc",
) -> PosthocModel:
    """Data + trained FloatLM under ``run_dir`` (reusing whatever is already complete)."""
    from trilm.data.pipeline import prepare_embedded
    from trilm.store.integrity import is_complete
    from trilm.train.trainer import Trainer

    run_dir = Path(run_dir)
    data = _prepared(run_dir / "data")
    if data is None:  # re-preparing finished data would hide its index from concurrent readers meanwhile
        data = prepare_embedded(run_dir / "data", vocab_size=VOCAB_SIZE, workers=2, progress=progress)
    cfg = train_config(run_dir, data, tokens, progress, model)
    final = Path(cfg.run_dir) / "snapshots" / f"step-{cfg.steps}"
    seconds = None
    if not is_complete(final):
        start = time.perf_counter()
        Trainer(cfg).fit()
        seconds = time.perf_counter() - start
    return PosthocModel(
        run_dir=run_dir,
        snapshot=final,
        train=Path(data["train"]),
        validation=Path(data["validation"]),
        tokenizer=Path(data["tokenizer"]),
        seq_len=cfg.sequence_length,
        train_seconds=seconds,
    )


def _prepared(data: Path) -> dict[str, Path] | None:
    """The data paths when the tokenizer and both splits are already prepared, else None."""
    paths = {
        "tokenizer": data / "tokenizer.model",
        "train": data / "train",
        "validation": data / "validation",
    }
    done = paths["tokenizer"].is_file() and all(
        (paths[s] / "index.json").is_file() for s in ("train", "validation")
    )
    return paths if done else None


def add_compression_args(parser: argparse.ArgumentParser) -> None:
    """The options every compression benchmark over this model shares: where it lives, which one,
    calibration and evaluation sizes, device and threads, where results go."""
    parser.add_argument("--run-dir", default="runs/posthoc", help="model, data and outputs live here")
    parser.add_argument("--model", choices=sorted(CONFIGS), default="posthoc", help="which FloatLM")
    parser.add_argument("--samples", type=int, default=128, help="calibration sequences")
    parser.add_argument("--calib-seed", type=int, default=0)
    parser.add_argument("--eval-sequences", type=int, default=256, help="validation sequences (0 = all)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--out", default=str(CHECKOUT / "benchmarks" / "results"), help="results folder")
    parser.add_argument("--no-progress", action="store_true")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", default="runs/posthoc", help="data and the trained model go here")
    parser.add_argument("--tokens", type=int, default=None, help="training tokens (default: the config's)")
    parser.add_argument("--model", choices=sorted(CONFIGS), default="posthoc", help="which FloatLM")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    model = prepare_posthoc_model(
        args.run_dir, tokens=args.tokens, progress=not args.no_progress, model=args.model
    )
    took = "already trained" if model.train_seconds is None else f"trained in {model.train_seconds:.0f} s"
    print(f"{model.snapshot} ({took})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
