"""Token streams for calibration and evaluation, from whatever a user points at.

Post-hoc calibration (``trilm quantize --calib``), pruning and ``trilm eval ppl --data`` all accept the same
sources, turned into one 1-D token stream with the data path's document convention (each document followed
by EOS, no BOS — how trilm models are trained):

- a prepared split directory (``index.json`` + packed shards): read as stored, no tokenizer needed;
- a SlimPajama-layout folder (``train/chunkK/*.jsonl.zst`` under a root, or one split's ``chunkK`` folders);
- a ``.jsonl`` / ``.jsonl.zst`` file of ``{"text": ...}`` rows (SlimPajama's ``meta`` is optional);
- a ``.txt`` file, one document.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from trilm.data.errors import DataError
from trilm.data.shards import INDEX_NAME, TokenShards
from trilm.data.slimpajama import SourceFile, read_documents, split_files
from trilm.data.tokenizer import Tokenizer


def token_stream(
    source: str | Path,
    tokenizer: Tokenizer | None = None,
    *,
    split: str = "validation",
    max_tokens: int | None = None,
) -> torch.Tensor:
    """All tokens of ``source`` (or its first ``max_tokens``) as a 1-D int64 tensor.

    ``split`` picks the split of a SlimPajama root folder. A prepared split whose tokenizer hash differs
    from ``tokenizer``'s is refused: its ids would be noise to the model.
    """
    path = Path(source)
    if not path.exists():
        raise DataError(f"{path}: no such file or directory")
    if path.is_dir() and (path / INDEX_NAME).is_file():
        shards = TokenShards.open(path)
        if tokenizer is not None and shards.tokenizer_hash != tokenizer.hash:
            raise DataError(
                f"{path}: prepared with tokenizer {shards.tokenizer_hash[:16]}…, but the model's tokenizer "
                f"is {tokenizer.hash[:16]}… ({tokenizer.path})"
            )
        end = shards.num_tokens if max_tokens is None else min(max_tokens, shards.num_tokens)
        return torch.from_numpy(shards.tokens(0, end))
    if tokenizer is None:
        raise DataError(f"{path}: raw text needs the model's tokenizer (none was found or given)")
    texts = _documents(path, split)
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer.encode(text))
        ids.append(tokenizer.eos_id)
        if max_tokens is not None and len(ids) >= max_tokens:
            return torch.tensor(ids[:max_tokens], dtype=torch.long)
    if not ids:
        raise DataError(f"{path}: contains no text")
    return torch.tensor(ids, dtype=torch.long)


def _documents(path: Path, split: str):

    name = path.name.lower()
    if path.is_dir():
        if (path / split).is_dir():
            files: list[SourceFile] | list[Path] = split_files(path, split)
        else:
            files = sorted(path.glob("chunk*/*.jsonl.zst")) or sorted(path.glob("*.jsonl.zst"))
            if not files:
                raise DataError(
                    f"{path}: neither a prepared split ({INDEX_NAME}) nor a SlimPajama folder "
                    f"({split}/chunkK/*.jsonl.zst or chunkK/*.jsonl.zst)"
                )
        for file in files:
            for doc in read_documents(file):
                yield doc.text
    elif name.endswith(".jsonl.zst"):
        for doc in read_documents(path):
            yield doc.text
    elif name.endswith(".jsonl"):
        yield from _jsonl_texts(path)
    elif name.endswith(".txt"):
        try:
            yield path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    else:
        raise DataError(
            f"{path}: unknown text source; expected a prepared split, a SlimPajama folder, "
            ".jsonl, .jsonl.zst or .txt"
        )


def _jsonl_texts(path: Path):
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise DataError(f"{where}: not valid JSON: {exc}") from None
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise DataError(f"{where}: expected an object with a string field 'text'")
            yield row["text"]


def sample_windows(
    tokens: torch.Tensor, n: int, seq_len: int, seed: int = 0, *, source: str = "the data"
) -> torch.Tensor:
    """``n`` windows of ``seq_len`` tokens [n, seq_len], drawn without overlap from a seeded shuffle of the
    stream's disjoint windows, so the same (data, n, seq_len, seed) always gives the same calibration set."""
    if n <= 0 or seq_len <= 0:
        raise DataError(f"need n > 0 and seq_len > 0, got n={n}, seq_len={seq_len}")
    available = tokens.numel() // seq_len
    if available < n:
        raise DataError(
            f"{source}: {tokens.numel():,} tokens hold only {available} windows of {seq_len} tokens, "
            f"but {n} were requested (use fewer samples, shorter windows or more data)"
        )
    order = torch.randperm(available, generator=torch.Generator().manual_seed(seed))[:n]
    starts = order.sort().values * seq_len
    return torch.stack([tokens[s : s + seq_len] for s in starts.tolist()]).long()
