"""Regenerate the offline lm-eval tasks' data from the embedded corpus's *test* split (never trained on).

    python train/build_eval_tasks.py          # rewrites trilm/eval/tasks/*.jsonl (deterministic, seed 0)

- ``trilm_cloze`` (multiple choice): a sentence without its last word; the true word against three last
  words of other sentences.
- ``trilm_lastword`` (log-likelihood, LAMBADA-style): the last word of a sentence given the rest; accuracy
  (greedy) and perplexity.
- ``trilm_rolling`` (rolling log-likelihood, wikitext-style): whole passages; word/byte perplexity, bits per
  byte.
- ``trilm_continue`` (generation): the first half of a line; exact match of the greedy rest of the line.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from trilm.data import embedded_corpus_dir
from trilm.data.slimpajama import read_documents, split_files

TASKS_DIR = Path(__file__).resolve().parents[1] / "trilm" / "eval" / "tasks"
_WORD = re.compile(r"^[A-Za-z]{3,}$")


def _documents() -> list[str]:

    files = split_files(embedded_corpus_dir(), "test")
    return [d.text for f in files for d in read_documents(f)]


def _sentences(docs: list[str]) -> list[str]:
    """Prose lines of 8–40 words that end in a plain word followed by one punctuation mark."""
    out = []
    for doc in docs:
        for line in doc.split("\n"):
            line = re.sub(r"^\d+ ", "", line.strip())  # verse numbers
            for sentence in re.split(r"(?<=[.!?])\s+", line):
                words = sentence.split(" ")
                if not 8 <= len(words) <= 40 or sentence[-1] not in ".!?":
                    continue
                last = words[-1][:-1]
                if _WORD.match(last):
                    out.append(" ".join([*words[:-1], last]))
    return out


def _write(name: str, rows: list[dict]) -> None:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    (TASKS_DIR / f"{name}.jsonl").write_text(text, encoding="utf-8")
    print(f"{name}.jsonl: {len(rows)} examples")


def build(seed: int = 0, n: int = 60) -> None:
    rng = random.Random(seed)
    docs = _documents()
    sentences = sorted(set(_sentences(docs)))
    rng.shuffle(sentences)
    cloze, lastword = sentences[:n], sentences[n : 2 * n]
    endings = sorted({s.rsplit(" ", 1)[1] for s in sentences})
    rows = []
    for s in cloze:
        context, gold = s.rsplit(" ", 1)
        distractors = rng.sample([w for w in endings if w.lower() != gold.lower()], 3)
        label = rng.randrange(4)
        choices = [*distractors[:label], gold, *distractors[label:]]
        rows.append({"context": context, "choices": choices, "label": label})
    _write("trilm_cloze", rows)
    _write("trilm_lastword", [{"text": s} for s in lastword])
    passages = [d[:2500] for d in docs if len(d) >= 1000][:8]
    _write("trilm_rolling", [{"page": p} for p in passages])
    lines = sorted({line.strip() for d in docs for line in d.split("\n") if 10 <= len(line.split()) <= 24})
    rng.shuffle(lines)
    rows = []
    for line in lines[:30]:
        words = line.split(" ")
        half = len(words) // 2
        rows.append({"prompt": " ".join(words[:half]), "target": " " + " ".join(words[half:])})
    _write("trilm_continue", rows)


if __name__ == "__main__":
    build()
