"""Packed token shards: a flat memory-mapped token file per input file, with sidecar metadata.

A prepared split directory holds, per input file ``split/chunkK/name.jsonl.zst``::

    split-chunkK-name.bin        tokens (uint16 if ids < 65,536, else uint32), documents back to back,
                                 EOS after each
    split-chunkK-name.docs.npy   int64 [documents, 2]: end offset of each document, index of its source
    split-chunkK-name.json       sidecar: counts per source, tokenizer hash, input file and checksum,
                                 bin checksum

and one ``index.json`` naming the shards in order with totals and the dataset fingerprint. Every file is
written to a temporary name, fsynced and renamed (:mod:`trilm.atomic`, which also removes what a killed
writer left); a shard's sidecar is written after its data, and ``index.json`` after every shard, so a crash
never leaves something that looks finished but is not.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from pathlib import Path
from tokenize import TokenError

import numpy as np

from trilm.atomic import AtomicFile, atomic_file, write_bytes
from trilm.data.errors import DataError

FORMAT_VERSION = 1
INDEX_NAME = "index.json"
_MAX_OPEN_SHARDS = 512


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits in 16 bits (vocab ≤ 65,536), else uint32: half the disk and page cache."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def atomic_write_json(path: Path, obj: dict) -> None:
    write_bytes(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


class ShardWriter:
    """Streams token arrays into ``name.bin`` (under a temporary name) and records document boundaries.

    ``finish(meta)`` fsyncs and renames the data files, then writes the sidecar last. ``abort()`` removes
    the temporary files. An existing sidecar of the same name is removed first, so a shard being
    rewritten is never mistaken for the old finished one.
    """

    def __init__(self, out_dir: Path, name: str, dtype: np.dtype):
        self.out_dir, self.name, self.dtype = Path(out_dir), name, np.dtype(dtype)
        self.sidecar = self.out_dir / f"{name}.json"
        self.sidecar.unlink(missing_ok=True)
        self.bin_path = self.out_dir / f"{name}.bin"
        self.bin = AtomicFile(self.bin_path)
        self.fh = self.bin.fh
        self.hash = hashlib.sha256()
        self.num_tokens = 0
        self.doc_ends: list[int] = []
        self.doc_sources: list[int] = []
        self.sources: list[str] = []
        self._source_index: dict[str, int] = {}
        self.tokens_per_source: dict[str, int] = {}
        self.documents_per_source: dict[str, int] = {}

    def add_documents(self, arrays: list[np.ndarray], sources: list[str]) -> None:
        """Append documents (each already ending with EOS) and account their tokens to their sources."""
        if not arrays:
            return
        flat = np.concatenate(arrays).astype(self.dtype, copy=False)
        data = flat.tobytes()
        self.fh.write(data)
        self.hash.update(data)
        for arr, source in zip(arrays, sources, strict=True):
            self.num_tokens += len(arr)
            idx = self._source_index.get(source)
            if idx is None:
                idx = self._source_index[source] = len(self.sources)
                self.sources.append(source)
            self.doc_ends.append(self.num_tokens)
            self.doc_sources.append(idx)
            self.tokens_per_source[source] = self.tokens_per_source.get(source, 0) + len(arr)
            self.documents_per_source[source] = self.documents_per_source.get(source, 0) + 1

    def finish(self, meta: dict) -> dict:
        docs = np.stack([np.asarray(self.doc_ends, np.int64), np.asarray(self.doc_sources, np.int64)], axis=1)
        docs = docs.reshape(-1, 2)
        self.bin.commit()
        with atomic_file(self.out_dir / f"{self.name}.docs.npy") as tmp, open(tmp, "wb") as fh:
            np.save(fh, docs)
        sidecar = {
            "format": FORMAT_VERSION,
            "name": self.name,
            "dtype": self.dtype.name,
            "num_tokens": self.num_tokens,
            "num_documents": len(self.doc_ends),
            "sources": self.sources,
            "tokens_per_source": dict(sorted(self.tokens_per_source.items())),
            "documents_per_source": dict(sorted(self.documents_per_source.items())),
            "bin_sha256": self.hash.hexdigest(),
            **meta,
        }
        atomic_write_json(self.sidecar, sidecar)
        return sidecar

    def abort(self) -> None:
        self.bin.abort()


def read_finished_shard(out_dir: Path, name: str) -> dict | None:
    """The sidecar of a finished shard whose data files are present and of the recorded size, else None."""
    out_dir = Path(out_dir)
    try:
        meta = json.loads((out_dir / f"{name}.json").read_text())
        if meta["dtype"] not in TOKEN_DTYPES or not _is_count(meta["num_tokens"]):
            return None
        itemsize = np.dtype(meta["dtype"]).itemsize
        if (out_dir / f"{name}.bin").stat().st_size != meta["num_tokens"] * itemsize:
            return None
        if not (out_dir / f"{name}.docs.npy").is_file():
            return None
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return meta


TOKEN_DTYPES = ("uint16", "uint32")


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _recorded(index: dict, shard: dict) -> dict:
    """What a shard's sidecar must agree with the index on."""
    return {"dtype": index["dtype"], "num_tokens": shard["num_tokens"], "bin_sha256": shard["bin_sha256"]}


def _check_index(path: Path, index: object) -> dict:
    """``index`` (the parsed ``index.json`` at ``path``) if it has every field a reader uses, of its type;
    else a :class:`DataError` naming the file and the field. A shard's name must be a plain file name:
    the index never points outside its directory."""
    if not isinstance(index, dict):
        raise DataError(f"{path}: expected a JSON object, got {type(index).__name__}")
    if index.get("format") != FORMAT_VERSION:
        raise DataError(f"{path}: format {index.get('format')!r}, this trilm reads {FORMAT_VERSION}")
    problems = []
    if index.get("dtype") not in TOKEN_DTYPES:
        problems.append(f"dtype: {index.get('dtype')!r} is not one of {', '.join(TOKEN_DTYPES)}")
    for key in ("fingerprint", "tokenizer_hash"):
        if not isinstance(index.get(key), str):
            problems.append(f"{key}: expected a string")
    for key in ("num_tokens", "num_documents"):
        if not _is_count(index.get(key)):
            problems.append(f"{key}: expected a count, got {index.get(key)!r}")
    vocab = index.get("vocab_size")
    if vocab is not None and not (_is_count(vocab) and vocab > 0):
        problems.append(f"vocab_size: expected a positive count, got {vocab!r}")
    for key in ("tokens_per_source", "documents_per_source"):
        table = index.get(key, {})  # read by ``trilm data stats`` only
        if not (isinstance(table, dict) and all(_is_count(v) for v in table.values())):
            problems.append(f"{key}: expected counts by source")
    shards = index.get("shards")
    if not isinstance(shards, list):
        problems.append("shards: expected a list")
        shards = []
    for i, shard in enumerate(shards):
        if not isinstance(shard, dict):
            problems.append(f"shards[{i}]: expected an object")
            continue
        name = shard.get("name")
        if not isinstance(name, str) or not name or name != Path(name).name or name.startswith("."):
            problems.append(f"shards[{i}].name: {name!r} is not a file name in the split")
        if not _is_count(shard.get("num_tokens")):
            problems.append(f"shards[{i}].num_tokens: expected a count, got {shard.get('num_tokens')!r}")
        if not isinstance(shard.get("bin_sha256"), str):
            problems.append(f"shards[{i}].bin_sha256: expected a string")
        sources = shard.get("sources")
        if not (isinstance(sources, list) and all(isinstance(x, str) for x in sources)):
            problems.append(f"shards[{i}].sources: expected a list of source names")
    if not problems and index["num_tokens"] != sum(s["num_tokens"] for s in shards):
        problems.append(f"num_tokens: {index['num_tokens']} is not the sum of the shards' num_tokens")
    if problems:
        raise DataError(f"{path}: {'; '.join(problems[:3])}")
    return index


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def fingerprint(tokenizer_hash: str, dtype: str, shards: list[dict]) -> str:
    """Content fingerprint of a prepared split: changes when any token, the order or the tokenizer does."""
    payload = [tokenizer_hash, dtype, [(s["name"], s["num_tokens"], s["bin_sha256"]) for s in shards]]
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()


class TokenShards:
    """A prepared split, read as one token stream (shards in index order) plus document boundaries.

    Sequences are windows of ``seq_len + 1`` tokens with stride ``seq_len`` (Megatron style): sample ``i``
    covers tokens ``[i*seq_len, (i+1)*seq_len]``, inputs are ``[:-1]`` and targets ``[1:]``, and every token
    except the first is a target exactly once per epoch. Windows run across document (EOS) and shard
    boundaries.
    """

    def __init__(self, path: Path, index: dict):
        self.path = Path(path)
        self.index = index
        self.shards: list[dict] = index["shards"]
        self.dtype = np.dtype(index["dtype"])
        self.fingerprint: str = index["fingerprint"]
        self.tokenizer_hash: str = index["tokenizer_hash"]
        self.num_tokens: int = int(index["num_tokens"])
        self.num_documents: int = int(index["num_documents"])
        self.offsets = np.cumsum([0] + [s["num_tokens"] for s in self.shards], dtype=np.int64)
        self.vocab_size: int | None = index.get("vocab_size")
        self._maps: OrderedDict[int, np.ndarray] = OrderedDict()
        self._docs: dict[int, np.ndarray] = {}

    @classmethod
    def open(cls, path: str | os.PathLike, *, verify: bool = False) -> TokenShards:
        """Open a prepared split; ``verify=True`` also re-hashes every ``.bin`` against its sidecar (reads
        every token once: ``data.verify_checksums`` in a run config). Without it, a shard is still checked
        for its size, and every token read is checked against the vocabulary."""
        path = Path(path)
        index_path = path / INDEX_NAME
        if not index_path.is_file():
            raise DataError(f"{path}: no {INDEX_NAME}; prepare did not finish there (rerun it to resume)")
        try:
            parsed = json.loads(index_path.read_text())
        except (OSError, ValueError, RecursionError) as exc:  # ValueError: not UTF-8, not JSON
            problem = "nested too deeply" if isinstance(exc, RecursionError) else exc
            raise DataError(f"{index_path}: unreadable: {problem}") from None
        index = _check_index(index_path, parsed)
        for shard in index["shards"]:
            meta = read_finished_shard(path, shard["name"])
            if meta is None or any(meta.get(k) != v for k, v in _recorded(index, shard).items()):
                raise DataError(f"{path / shard['name']}.bin: missing, truncated or not the shard indexed")
            if verify:
                digest = _file_sha256(path / f"{shard['name']}.bin")
                if digest != shard["bin_sha256"]:
                    raise DataError(f"{path / shard['name']}.bin: checksum mismatch (file changed on disk)")
        return cls(path, index)

    # ------------------------------------------------------------------ tokens
    def _shard(self, k: int) -> np.ndarray:
        arr = self._maps.get(k)
        if arr is None:
            name = self.shards[k]["name"]
            n = self.shards[k]["num_tokens"]
            if n == 0:
                arr = np.zeros(0, self.dtype)
            else:
                arr = np.memmap(self.path / f"{name}.bin", dtype=self.dtype, mode="r", shape=(n,))
            self._maps[k] = arr
            if len(self._maps) > _MAX_OPEN_SHARDS:
                self._maps.popitem(last=False)
        else:
            self._maps.move_to_end(k)
        return arr

    def tokens(self, start: int, end: int) -> np.ndarray:
        """Tokens ``[start, end)`` of the whole split as int64, read across shard boundaries."""
        if not 0 <= start <= end <= self.num_tokens:
            raise IndexError(f"token range [{start}, {end}) outside [0, {self.num_tokens})")
        out: np.ndarray = np.empty(end - start, np.int64)
        k = int(np.searchsorted(self.offsets, start, side="right")) - 1
        pos = start
        while pos < end:
            lo = pos - int(self.offsets[k])
            take = min(end - pos, int(self.offsets[k + 1]) - pos)
            piece = self._shard(k)[lo : lo + take]
            if self.vocab_size is not None and take and int(piece.max()) >= self.vocab_size:
                self._bad_token(k, lo, piece)
            out[pos - start : pos - start + take] = piece
            pos += take
            k += 1
        return out

    def _bad_token(self, k: int, lo: int, piece: np.ndarray) -> None:
        at = int(np.argmax(piece >= self.vocab_size))
        raise DataError(
            f"{self.path / self.shards[k]['name']}.bin: token {lo + at} is id {int(piece[at])}, outside the "
            f"vocabulary of {self.vocab_size}: the shard is corrupted (its checksum is checked with "
            "data.verify_checksums=true); prepare it again"
        )

    def num_sequences(self, seq_len: int) -> int:
        if seq_len <= 0:
            raise DataError(f"seq_len must be positive, got {seq_len}")
        return max(0, (self.num_tokens - 1) // seq_len)

    def sequence(self, i: int, seq_len: int) -> np.ndarray:
        """Sample ``i``: ``seq_len + 1`` tokens starting at ``i * seq_len``."""
        n = self.num_sequences(seq_len)
        if not 0 <= i < n:
            raise IndexError(f"sequence {i} outside [0, {n}) at seq_len {seq_len}")
        return self.tokens(i * seq_len, i * seq_len + seq_len + 1)

    # ------------------------------------------------------------------ documents
    def _doc_table(self, k: int) -> np.ndarray:
        """Shard ``k``'s ``[documents, 2]`` table (end offset, source index), checked against the shard."""
        if k not in self._docs:
            path = self.path / f"{self.shards[k]['name']}.docs.npy"
            try:
                table = np.load(path)
            except (OSError, ValueError, EOFError, SyntaxError, TokenError) as exc:  # numpy parses the header
                raise DataError(f"{path}: unreadable document table ({exc})") from None
            n, sources = self.shards[k]["num_tokens"], len(self.shards[k]["sources"])
            sound = (
                isinstance(table, np.ndarray)
                and table.ndim == 2
                and table.shape[1] == 2
                and table.dtype.kind in "iu"
                and bool(np.all(np.diff(table[:, 0]) >= 0))
                and bool(np.all((table[:, 0] >= 0) & (table[:, 0] <= n)))
                and bool(np.all((table[:, 1] >= 0) & (table[:, 1] < sources)))
            )
            if not sound:
                raise DataError(
                    f"{path}: not the document table of the shard (expected [documents, 2] integers, end"
                    f" offsets rising to at most {n}, source indices below {sources}); prepare it again"
                )
            self._docs[k] = table
        return self._docs[k]

    def documents_in(self, start: int, end: int) -> list[dict]:
        """Documents overlapping tokens ``[start, end)``: shard, document number, source and token span."""
        found = []
        k = int(np.searchsorted(self.offsets, start, side="right")) - 1
        while k < len(self.shards) and self.offsets[k] < end:
            base = int(self.offsets[k])
            table = self._doc_table(k)
            ends: np.ndarray = table[:, 0] + base
            first = int(np.searchsorted(ends, start, side="right"))
            for d in range(first, len(table)):
                doc_start = base + (int(table[d - 1, 0]) if d else 0)
                if doc_start >= end:
                    break
                found.append(
                    {
                        "shard": self.shards[k]["name"],
                        "document": d,
                        "source": self.shards[k]["sources"][int(table[d, 1])],
                        "start": doc_start,
                        "end": int(ends[d]),
                    }
                )
            k += 1
        return found

    def __repr__(self) -> str:
        return f"TokenShards({self.path}, tokens={self.num_tokens}, shards={len(self.shards)})"
