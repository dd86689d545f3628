"""A GGUF file's structure checked against its own size before any reader trusts a count in it.

``gguf.GGUFReader`` walks a file by the counts and lengths the file declares: a header-only file, a tensor
count of 2^60 or a string length past the end turns into ``IndexError``, ``KeyError`` or an attempt to
allocate for the declared count. trilm reads a GGUF file that a user hands it (``trilm import gguf``), so
the bytes are untrusted: :func:`check_gguf` walks the same layout (header, metadata key/value pairs, tensor
infos, aligned tensor data) with every count and length bounded by the bytes that are left *before* it is
used, and raises :class:`GGUFFormatError` naming the file, the section, the field and the byte offset.
:func:`open_gguf` checks first and only then hands the file to ``GGUFReader``.

The checker reads the file through ``mmap`` and never allocates more than one key, string or tensor info at
a time; arrays of fixed-size items are skipped by arithmetic, not read.
"""

from __future__ import annotations

import dataclasses
import itertools
import mmap
import struct
from pathlib import Path
from typing import Any

from trilm.config import FileFormatError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
"""The GGUF versions ``gguf.GGUFReader`` reads."""
MAX_DIMS = 4
"""GGML_MAX_DIMS: a tensor has at most four dimensions."""
DEFAULT_ALIGNMENT = 32
HEADER_BYTES = 24
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_MIN_KV = 8 + 4 + 1
"""The smallest encoded key/value pair: an empty key, its type and a one-byte value."""
_MIN_TENSOR_INFO = 8 + 4 + 4 + 8
"""The smallest encoded tensor info: an empty name, no dimensions, its type and its offset."""
_MAX_ARRAY_DEPTH = 2


class GGUFFormatError(FileFormatError):
    """A GGUF file that is not well formed; the message names the file, the section, the field and the
    byte offset, so a user can tell a truncated download from a file some other tool wrote wrongly."""


@dataclasses.dataclass(frozen=True)
class TensorSpan:
    name: str
    start: int
    """Absolute byte offset of the tensor's data in the file."""
    nbytes: int


@dataclasses.dataclass(frozen=True)
class GGUFLayout:
    """What :func:`check_gguf` found: the counts, the alignment and where every tensor's bytes lie."""

    version: int
    byte_order: str
    tensor_count: int
    kv_count: int
    alignment: int
    data_offset: int
    size: int
    keys: tuple[str, ...]
    tensors: tuple[TensorSpan, ...]


class _Walk:
    def __init__(self, path: Path, buf: Any, size: int):
        self.path, self.buf, self.size, self.order = path, buf, size, "<"

    def error(self, section: str, what: str, offset: int) -> GGUFFormatError:
        return GGUFFormatError(f"{self.path}: {section}: {what} (byte offset {offset} of {self.size})")

    def unpack(self, fmt: str, offset: int, section: str, field: str) -> tuple[Any, int]:
        n = struct.calcsize(fmt)
        if offset + n > self.size:
            raise self.error(section, f"{field} needs {n} bytes but the file ends (truncated)", offset)
        return struct.unpack_from(self.order + fmt, self.buf, offset)[0], offset + n

    def string(self, offset: int, section: str, field: str) -> tuple[str, int]:
        length, start = self.unpack("Q", offset, section, f"{field} length")
        if length > self.size - start:
            raise self.error(
                section,
                f"{field} length {length} runs past the end of the file ({self.size - start} left)",
                offset,
            )
        raw = bytes(self.buf[start : start + length])
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.error(
                section, f"{field} is not UTF-8 (byte 0x{raw[exc.start]:02x})", start + exc.start
            ) from None
        return text, start + length

    def value(self, vtype: int, offset: int, section: str, field: str, depth: int = 0) -> tuple[Any, int]:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype], offset, section, field)
        if vtype == _STRING:
            return self.string(offset, section, field)
        if vtype != _ARRAY:
            raise self.error(section, f"{field} has value type {vtype}, which GGUF does not define", offset)
        if depth >= _MAX_ARRAY_DEPTH:
            raise self.error(section, f"{field} nests arrays deeper than {_MAX_ARRAY_DEPTH}", offset)
        itype, p = self.unpack("I", offset, section, f"{field} array item type")
        count, p = self.unpack("Q", p, section, f"{field} array length")
        if itype in _SCALARS:
            item = struct.calcsize(_SCALARS[itype])
        elif itype in (_STRING, _ARRAY):
            item = 8 if itype == _STRING else 12
        else:
            raise self.error(
                section, f"{field} is an array of value type {itype}, which GGUF does not define", p
            )
        if count * item > self.size - p:
            raise self.error(
                section,
                f"{field} array of {count} items cannot fit in the {self.size - p} bytes left",
                offset,
            )
        if itype in _SCALARS:
            return None, p + count * item
        for i in range(count):
            _, p = self.value(itype, p, section, f"{field}[{i}]", depth + 1)
        return None, p


def _tensor_info(walk: _Walk, p: int, index: int) -> tuple[str, tuple[int, ...], int, int, int, int]:
    """(name, dims, ggml type, declared offset, bytes, next position) of tensor info ``index``."""
    # deferred for start-up time: loads gguf only when called
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    section = "tensor infos"
    at = p
    name, p = walk.string(p, section, f"tensor {index} name")
    label = f"tensor {index} ({name!r})"
    n_dims, p = walk.unpack("I", p, section, f"{label} n_dims")
    if n_dims > MAX_DIMS:
        raise walk.error(section, f"{label} declares n_dims {n_dims}; GGUF allows at most {MAX_DIMS}", at)
    dims = []
    for d in range(n_dims):
        dim, p = walk.unpack("Q", p, section, f"{label} dimension {d}")
        dims.append(dim)
    raw_type, p = walk.unpack("I", p, section, f"{label} type")
    try:
        ggml_type = GGMLQuantizationType(raw_type)
        block, type_size = GGML_QUANT_SIZES[ggml_type]
    except (ValueError, KeyError):
        raise walk.error(
            section, f"{label} has ggml type {raw_type}, which gguf does not know", p - 4
        ) from None
    offset, p = walk.unpack("Q", p, section, f"{label} data offset")
    elements = 1
    for dim in dims:
        elements *= dim
    if dims and dims[0] % block:
        raise walk.error(
            section,
            f"{label} row length {dims[0]} is not a multiple of {ggml_type.name}'s block of {block}",
            at,
        )
    return name, tuple(dims), raw_type, offset, elements * type_size // block, p


def _walk(walk: _Walk) -> GGUFLayout:
    if walk.size < HEADER_BYTES:
        raise walk.error("header", f"{walk.size} bytes, shorter than the {HEADER_BYTES}-byte GGUF header", 0)
    if bytes(walk.buf[:4]) != MAGIC:
        raise walk.error("header", f"magic {bytes(walk.buf[:4])!r} is not {MAGIC!r}: not a GGUF file", 0)
    version, _ = walk.unpack("I", 4, "header", "version")
    if version & 0xFFFF == 0:
        walk.order = ">"
        version, _ = walk.unpack("I", 4, "header", "version")
    if version not in VERSIONS:
        raise walk.error("header", f"version {version} (trilm reads GGUF versions 2 and 3)", 4)
    tensor_count, p = walk.unpack("Q", 8, "header", "tensor count")
    kv_count, p = walk.unpack("Q", p, "header", "metadata key/value count")
    if tensor_count * _MIN_TENSOR_INFO + kv_count * _MIN_KV > walk.size - p:
        raise walk.error(
            "header",
            f"tensor count {tensor_count} and key/value count {kv_count} cannot fit in the "
            f"{walk.size - p} bytes after the header",
            8,
        )
    keys: list[str] = []
    seen: set[str] = set()
    alignment = DEFAULT_ALIGNMENT
    for i in range(kv_count):
        at = p
        key, p = walk.string(p, "metadata", f"key {i}")
        if key in seen:
            raise walk.error("metadata", f"key {key!r} appears twice", at)
        seen.add(key)
        keys.append(key)
        vtype, p = walk.unpack("I", p, "metadata", f"{key} value type")
        value, p = walk.value(vtype, p, "metadata", key)
        if key == "general.alignment":
            if vtype != _UINT32 or not value or value & (value - 1):
                raise walk.error(
                    "metadata", f"general.alignment {value!r} is not a power of two (uint32)", at
                )
            alignment = value
    spans: list[TensorSpan] = []
    names: set[str] = set()
    infos = []
    for i in range(tensor_count):
        at = p
        name, _dims, _type, offset, nbytes, p = _tensor_info(walk, p, i)
        if name in names:
            raise walk.error("tensor infos", f"tensor name {name!r} appears twice", at)
        names.add(name)
        infos.append((name, offset, nbytes, at))
    data_offset = p + (-p % alignment)
    if tensor_count and data_offset > walk.size:
        raise walk.error("tensor data", f"the data section would start at {data_offset}, past the end", p)
    for name, offset, nbytes, at in infos:
        if offset % alignment:
            raise walk.error(
                "tensor infos", f"tensor {name!r} data offset {offset} is not {alignment}-aligned", at
            )
        if offset + nbytes > walk.size - data_offset:
            raise walk.error(
                "tensor data",
                f"tensor {name!r} needs bytes {offset}..{offset + nbytes} of the data section, which holds "
                f"{walk.size - data_offset} (truncated, or an offset past the end)",
                data_offset + min(offset, walk.size),
            )
        spans.append(TensorSpan(name, data_offset + offset, nbytes))
    ordered = sorted(spans, key=lambda s: (s.start, s.nbytes))
    for a, b in itertools.pairwise(ordered):
        if a.nbytes and b.nbytes and b.start < a.start + a.nbytes:
            raise walk.error("tensor data", f"tensors {a.name!r} and {b.name!r} overlap", b.start)
    return GGUFLayout(
        version,
        walk.order,
        tensor_count,
        kv_count,
        alignment,
        data_offset,
        walk.size,
        tuple(keys),
        tuple(spans),
    )


def check_gguf(path: str | Path) -> GGUFLayout:
    """Walk ``path``'s GGUF layout, every count and length checked against the bytes left; raise
    :class:`GGUFFormatError` naming the section, field and offset of the first thing that is wrong."""
    path = Path(path)
    if not path.is_file():
        raise GGUFFormatError(f"{path}: no such GGUF file")
    try:
        with open(path, "rb") as fh:
            size = path.stat().st_size
            if size == 0:
                raise GGUFFormatError(f"{path}: header: the file is empty (byte offset 0 of 0)")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _walk(_Walk(path, buf, size))
    except OSError as exc:
        raise GGUFFormatError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def open_gguf(path: str | Path) -> Any:
    """A ``gguf.GGUFReader`` of ``path``, once :func:`check_gguf` has found its layout whole."""
    # deferred for start-up time: loads gguf only when called
    from gguf import GGUFReader

    path = Path(path)
    check_gguf(path)
    try:
        return GGUFReader(path)
    except (ValueError, KeyError, IndexError, TypeError, OverflowError, OSError) as exc:
        raise GGUFFormatError(
            f"{path}: the gguf package cannot read it ({type(exc).__name__}: {exc})"
        ) from None
