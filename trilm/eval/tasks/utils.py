"""Loaders and result processing for the offline tasks; lm-eval imports this file from the YAMLs."""

from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load_jsonl(file: str, **_metadata):
    """The shipped ``file`` (next to this module) as a ``test`` split; no network, no datasets cache."""
    # deferred for start-up time: loads datasets only when called
    from datasets import Dataset, DatasetDict

    path = HERE / file
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return DatasetDict({"test": Dataset.from_list(rows)})


def rolling_results(doc, results):
    """Word and byte perplexity and bits per byte of a passage (counts over the passage as given)."""
    (loglikelihood,) = results
    words = len(re.split(r"\s+", doc["page"]))
    size = len(doc["page"].encode("utf-8"))
    return {
        "word_perplexity": (loglikelihood, words),
        "byte_perplexity": (loglikelihood, size),
        "bits_per_byte": (loglikelihood, size),
    }
