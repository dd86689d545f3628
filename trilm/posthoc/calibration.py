"""Calibration data: N windows of L tokens, seeded, from any text source trilm reads.

The source is what :func:`trilm.data.text_source.token_stream` accepts — a prepared split directory (read as
stored), a SlimPajama-layout folder, a ``.jsonl`` / ``.jsonl.zst`` file or a ``.txt`` file — and the windows
come from :func:`trilm.data.text_source.sample_windows` (disjoint windows of a seeded shuffle), so the same
(source, N, L, seed) always gives the same calibration set. To keep calibration cheap on large corpora only
the first ``max_tokens`` tokens of the stream are read (default 16·N·L, recorded in the QuantLM metadata).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from trilm.config import Config, ConfigError, require
from trilm.data.text_source import sample_windows, token_stream

STREAM_FACTOR = 16
"""Tokens read from the source per requested calibration token (0 = the whole source)."""


@dataclasses.dataclass
class CalibrationConfig(Config):
    """Where the calibration windows come from (the reference: 128 × 2048-token windows, seed 0)."""

    source: str = ""
    samples: int = 128
    seq_len: int = 2048
    seed: int = 0
    split: str = "train"
    """Split of a SlimPajama root folder (ignored for files and prepared splits)."""
    stream_factor: int = STREAM_FACTOR

    def validate(self) -> None:
        require(bool(self.source), "calib: a calibration source (prepared split, folder or file) is required")
        require(self.samples > 0, f"calib samples: must be > 0, got {self.samples}")
        require(self.seq_len > 0, f"calib seq_len: must be > 0, got {self.seq_len}")
        require(self.stream_factor >= 0, f"calib stream_factor: must be >= 0, got {self.stream_factor}")


@dataclasses.dataclass
class Calibration:
    """The windows and a JSON-able record of how they were drawn (for the QuantLM metadata)."""

    windows: torch.Tensor
    """int64 [samples, seq_len]."""
    record: dict[str, Any]


def load_calibration(cfg: CalibrationConfig, tokenizer=None) -> Calibration:
    """Read the source and draw the windows; errors name the source (too short, unreadable, ...)."""

    wanted = cfg.samples * cfg.seq_len
    cap = wanted * cfg.stream_factor if cfg.stream_factor else None
    tokens = token_stream(cfg.source, tokenizer, split=cfg.split, max_tokens=cap)
    windows = sample_windows(tokens, cfg.samples, cfg.seq_len, cfg.seed, source=str(cfg.source))
    record = {
        "source": str(Path(cfg.source)),
        "split": cfg.split,
        "samples": cfg.samples,
        "seq_len": cfg.seq_len,
        "seed": cfg.seed,
        "stream_tokens": int(tokens.numel()),
        "tokenizer_hash": getattr(tokenizer, "hash", None),
    }
    return Calibration(windows, record)


def check_vocabulary(windows: torch.Tensor, vocab_size: int, source: str) -> None:
    """Refuse token ids the model has no embedding for (a tokenizer/model mismatch)."""

    top = int(windows.max()) if windows.numel() else -1
    if top >= vocab_size:
        raise ConfigError(
            f"{source}: token id {top} is outside the model's vocabulary ({vocab_size}); "
            "was the calibration data tokenized with another tokenizer?"
        )
