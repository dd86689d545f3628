"""Reading SlimPajama as published: ``{split}/chunkK/example_{train,holdout}_N.jsonl.zst``.

Each line is ``{"text": ..., "meta": {"redpajama_set_name": ...}}``. Files come from a local directory or,
online, from the Hugging Face hub through ``datasets`` (``cerebras/SlimPajama-627B``, streamed file by file so
that a file stays the unit of work, of resumption and of provenance).

Bad input is never silently dropped: a corrupt or truncated ``.zst``, a malformed JSON line, a missing
``text`` or source, an empty or non-UTF-8 document raises :class:`DataError` naming the file and line, or,
with ``skip_bad=True``, is counted in :class:`ReadStats` (per reason, with the first few locations).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import zstandard

from trilm.data.errors import DataError

SPLITS = ("train", "validation", "test")
HUB_REPO = "cerebras/SlimPajama-627B"
# The seven SlimPajama sources, with their share of the 627B tokens (SlimPajama paper, table 1).
SLIMPAJAMA_SOURCES = {
    "RedPajamaCommonCrawl": 0.5220,
    "RedPajamaC4": 0.2670,
    "RedPajamaGithub": 0.0520,
    "RedPajamaBook": 0.0420,
    "RedPajamaArXiv": 0.0460,
    "RedPajamaWikipedia": 0.0380,
    "RedPajamaStackExchange": 0.0330,
}
_READ_BYTES = 1 << 20
_FILE_ORDER = re.compile(r"chunk(\d+)/[^/]*?(\d+)\.jsonl\.zst$")


def check_source_names(names, option: str) -> None:
    """Raise :class:`DataError` for a name that is not one of the seven SlimPajama sources."""

    for name in names:
        if name not in SLIMPAJAMA_SOURCES:
            close = difflib.get_close_matches(name, list(SLIMPAJAMA_SOURCES), n=1, cutoff=0.4)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise DataError(
                f"{option} {name!r}: not a SlimPajama source{hint}; sources are "
                + ", ".join(SLIMPAJAMA_SOURCES)
            )


@dataclasses.dataclass(frozen=True)
class SourceFile:
    """One input file: ``path`` to open (local path or ``hf://`` URL), ``key`` = ``split/chunkK/name``."""

    path: str
    key: str

    @property
    def shard_name(self) -> str:
        return self.key.removesuffix(".jsonl.zst").replace("/", "-")


@dataclasses.dataclass(frozen=True)
class Document:
    text: str
    source: str
    file: str
    line: int


@dataclasses.dataclass
class ReadStats:
    """Counts of what a read kept and skipped; ``examples`` keeps the first few skip locations per reason."""

    documents: int = 0
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)
    examples: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    def skip(self, reason: str, where: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        shown = self.examples.setdefault(reason, [])
        if len(shown) < 5:
            shown.append(where)

    def merge(self, other: ReadStats) -> None:
        self.documents += other.documents
        for reason, n in other.skipped.items():
            self.skipped[reason] = self.skipped.get(reason, 0) + n
            self.examples.setdefault(reason, [])
            self.examples[reason] = (self.examples[reason] + other.examples.get(reason, []))[:5]

    def to_dict(self) -> dict:
        return {"documents": self.documents, "skipped": dict(self.skipped), "examples": dict(self.examples)}


@dataclasses.dataclass(frozen=True)
class SourceMixture:
    """Per-source weights: 0 drops a source, 0.5 keeps half its documents, 2 repeats each document twice.

    Sources not named get ``default``. The fractional part is decided per document by a hash of its file
    key and line, so a mixture is reproducible and independent of worker count or file order.
    """

    weights: dict[str, float] = dataclasses.field(default_factory=dict)
    default: float = 1.0

    def __post_init__(self) -> None:
        for name, w in self.weights.items():
            if not w >= 0:
                raise DataError(f"source weight for {name!r} must be >= 0, got {w!r}")

    @classmethod
    def from_options(cls, exclude=(), weights: dict[str, float] | None = None, include=()) -> SourceMixture:
        """``include`` (if given) keeps only those sources; ``exclude`` drops; ``weights`` rescale.

        Every name must be a SlimPajama source: a misspelt one would otherwise filter nothing (exclude) or
        everything (include) without a word.
        """
        check_source_names(include, "--include-source")
        check_source_names(exclude, "--exclude-source")
        check_source_names(weights or {}, "--weight")
        table = dict(weights or {})
        for name in exclude:
            table[name] = 0.0
        if include:
            for name in include:
                table.setdefault(name, 1.0)
            return cls(table, default=0.0)
        return cls(table)

    def weight(self, source: str) -> float:
        return self.weights.get(source, self.default)

    def copies(self, source: str, file_key: str, line: int) -> int:
        w = self.weight(source)
        whole, frac = int(w), w - int(w)
        if frac > 0:
            digest = hashlib.blake2b(f"{file_key}:{line}".encode(), digest_size=8).digest()
            whole += int.from_bytes(digest, "little") / 2**64 < frac
        return whole

    def to_dict(self) -> dict:
        return {"weights": dict(sorted(self.weights.items())), "default": self.default}


def _file_order(key: str) -> tuple:
    m = _FILE_ORDER.search(key)
    return (int(m.group(1)), int(m.group(2)), key) if m else (1 << 30, 0, key)


def split_files(root: str | Path, split: str) -> list[SourceFile]:
    """The split's ``chunk*/*.jsonl.zst`` files under a local SlimPajama-shaped directory, in chunk order."""
    if split not in SPLITS:
        raise DataError(f"split: {split!r} is not one of {list(SPLITS)}")
    root = Path(root)
    base = root / split
    if not base.is_dir():
        raise DataError(f"{base}: no such split directory (expected {split}/chunkK/*.jsonl.zst under {root})")
    files = [SourceFile(str(p), p.relative_to(root).as_posix()) for p in base.glob("chunk*/*.jsonl.zst")]
    if not files:
        raise DataError(f"{base}: no chunk*/*.jsonl.zst files")
    return sorted(files, key=lambda f: _file_order(f.key))


def hub_split_files(split: str, repo: str = HUB_REPO) -> list[SourceFile]:
    """The split's files in the hub dataset repo, as ``hf://`` URLs (needs network; never used by tests)."""
    # deferred for start-up time: loads huggingface_hub only when called
    from huggingface_hub import HfFileSystem

    fs = HfFileSystem()
    prefix = f"datasets/{repo}/"
    found = fs.glob(f"{prefix}{split}/chunk*/*.jsonl.zst")
    if not found:
        raise DataError(f"hf://{prefix}{split}: no chunk*/*.jsonl.zst files found")
    files = [SourceFile(f"hf://{p}", p.removeprefix(prefix)) for p in found]
    return sorted(files, key=lambda f: _file_order(f.key))


def _parse_line(raw: bytes, where: str) -> tuple[str | None, str | None, str | None]:
    """(text, source, None) for a good line, (None, None, reason) for a bad one."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, None, f"non-UTF-8 bytes at column {exc.start + 1}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        return None, None, f"malformed JSON ({exc.msg} at column {exc.colno})"
    return _check_row(row, where, surrogates=b"\\ud" in raw or b"\\uD" in raw)


def _check_row(row, where: str, surrogates: bool = True) -> tuple[str | None, str | None, str | None]:
    if not isinstance(row, dict):
        return None, None, "malformed JSON (a line must be an object)"
    text = row.get("text")
    if not isinstance(text, str):
        return None, None, "missing 'text'" if text is None else "'text' is not a string"
    meta = row.get("meta")
    source = meta.get("redpajama_set_name") if isinstance(meta, dict) else None
    if not isinstance(source, str) or not source:
        return None, None, "missing 'meta.redpajama_set_name'"
    if surrogates:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return None, None, f"non-UTF-8 text (lone surrogate at character {exc.start})"
    if not text.strip():
        return None, None, "empty document"
    return text, source, None


def _reason_kind(reason: str) -> str:
    return reason.split(" (")[0].split(" at ")[0]


def read_documents(
    file: SourceFile | str | Path, *, skip_bad: bool = False, stats: ReadStats | None = None
) -> Iterator[Document]:
    """Stream the documents of one ``.jsonl.zst`` file (local), checking every line.

    Decompresses incrementally (constant memory per file), so a 1 GB chunk file costs a 1 MB buffer.
    A truncated stream is detected at the end (zstd frame not finished), not silently cut.
    """
    if not isinstance(file, SourceFile):
        file = SourceFile(str(file), Path(file).name)
    stats = stats if stats is not None else ReadStats()
    name = file.path
    lineno = 0

    def bad(reason: str, where: str) -> None:
        if not skip_bad:
            raise DataError(f"{where}: {reason} (pass skip_bad / --skip-bad to count and skip such input)")
        stats.skip(_reason_kind(reason), where)

    try:
        fh = open(name, "rb")  # noqa: SIM115 - closed in finally, around a generator
    except OSError as exc:
        raise DataError(f"{name}: cannot open: {exc.strerror}") from None
    try:
        dobj = zstandard.ZstdDecompressor().decompressobj()
        pending: list[bytes] = []  # the unfinished last line, in pieces (a long line costs no re-copying)
        while True:
            chunk = fh.read(_READ_BYTES)
            if not chunk:
                break
            pieces = []
            try:
                while chunk:  # a file may hold several zstd frames, possibly split across reads
                    if dobj.eof:
                        dobj = zstandard.ZstdDecompressor().decompressobj()
                    pieces.append(dobj.decompress(chunk))
                    chunk = dobj.unused_data if dobj.eof else b""
            except zstandard.ZstdError as exc:
                bad(f"corrupt zstd data ({exc})", f"{name}: after line {lineno}")
                return
            out = b"".join(pieces)
            if b"\n" not in out:
                if out:
                    pending.append(out)
                continue
            lines = out.split(b"\n")
            if pending:
                lines[0] = b"".join([*pending, lines[0]])
            pending = [lines.pop()]
            for raw in lines:
                lineno += 1
                yield from _document(raw, file, lineno, bad, stats)
        if not dobj.eof:
            bad("truncated zstd stream (the file ends inside a frame)", f"{name}: after line {lineno}")
            return
        tail = b"".join(pending)
        if tail:
            lineno += 1
            yield from _document(tail, file, lineno, bad, stats)
    finally:
        fh.close()


def _document(raw: bytes, file: SourceFile, lineno: int, bad, stats: ReadStats) -> Iterator[Document]:
    if not raw.strip():
        return  # blank separator lines carry no document
    where = f"{file.path}:{lineno}"
    text, source, reason = _parse_line(raw, where)
    if reason is not None:
        bad(reason, where)
        return
    assert text is not None and source is not None  # _parse_line gives both when there is no reason
    stats.documents += 1
    yield Document(text, source, file.key, lineno)


def read_documents_datasets(
    file: SourceFile | str, *, skip_bad: bool = False, stats: ReadStats | None = None
) -> Iterator[Document]:
    """The same documents through ``datasets``' streaming JSON loader (local path or ``hf://`` URL).

    This is the path for the hub; it is also how a local file reads when ``reader="datasets"``. Line
    numbers are row numbers (the loader drops blank lines); bad rows are checked like the local reader's.
    """
    # deferred for start-up time: loads datasets only when called
    import datasets

    if not isinstance(file, SourceFile):
        file = SourceFile(str(file), Path(str(file)).name)
    stats = stats if stats is not None else ReadStats()
    try:
        rows = datasets.load_dataset("json", data_files=file.path, split="train", streaming=True)
        for lineno, row in enumerate(rows, start=1):
            where = f"{file.path}:{lineno}"
            text, source, reason = _check_row(row, where)
            if reason is not None:
                if not skip_bad:
                    raise DataError(f"{where}: {reason} (pass skip_bad / --skip-bad to count and skip)")
                stats.skip(_reason_kind(reason), where)
                continue
            assert text is not None and source is not None  # _check_row gives both when there is no reason
            stats.documents += 1
            yield Document(text, source, file.key, lineno)
    except DataError:
        raise
    except Exception as exc:  # the loader raises pyarrow/zstd/OS errors of many kinds
        if not skip_bad:
            raise DataError(f"{file.path}: cannot be read by datasets: {type(exc).__name__}: {exc}") from exc
        stats.skip("unreadable file", f"{file.path}: {type(exc).__name__}")


def file_sha256(path: str) -> str:
    """Checksum of an input file's bytes (local files; ``hf://`` files are checksummed by the hub)."""
    if path.startswith("hf://"):
        return ""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_READ_BYTES * 4):
            h.update(block)
    return h.hexdigest()


def source_statistics(files: list[SourceFile], *, skip_bad: bool = False, tokenizer=None) -> dict[str, dict]:
    """Documents, UTF-8 bytes (and tokens, given a tokenizer) per ``redpajama_set_name`` of raw files."""
    table: dict[str, dict] = {}
    for f in files:
        for doc in read_documents(f, skip_bad=skip_bad):
            row = table.setdefault(doc.source, {"documents": 0, "bytes": 0})
            row["documents"] += 1
            row["bytes"] += len(doc.text.encode("utf-8"))
            if tokenizer is not None:
                row["tokens"] = row.get("tokens", 0) + len(tokenizer.encode(doc.text)) + 1
    return dict(sorted(table.items()))
