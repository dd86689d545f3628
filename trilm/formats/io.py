"""One safetensors file of packed layers: ``{layer}.{tensor}`` entries plus per-layer meta in the header.

The header's ``trilm.packed`` entry is a JSON object ``{layer: PackedWeight.meta()}``; any extra string
metadata (method, settings) is kept alongside. Export, the engine and tests all go through these two
functions, so a file written by one is read by the others.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from trilm.atomic import atomic_file
from trilm.config import ConfigError
from trilm.formats.base import FormatError, PackedWeight, from_tensors

HEADER_KEY = "trilm.packed"


class PackedFileError(FormatError, ConfigError):
    """A packed file that cannot be read as written (truncated, damaged, or a header that is not layer
    meta); the message names the file and the layer. A :class:`ConfigError` too, so a command given such a
    file exits with status 2 and one line, not a traceback."""


def save_packed(
    path: str | Path, layers: Mapping[str, PackedWeight], metadata: Mapping[str, str] | None = None
) -> None:
    """Write ``layers`` to ``path`` (to a temporary name, then renamed: a crash leaves no half file)."""
    path = Path(path)
    tensors: dict[str, torch.Tensor] = {}
    metas = {}
    for name, weight in layers.items():
        if "." in name and name.rsplit(".", 1)[1] in weight.to_tensors():
            raise FormatError(f"{path}: layer name {name!r} would clash with its tensor names")
        metas[name] = weight.meta()
        for field, tensor in weight.to_tensors().items():
            tensors[f"{name}.{field}"] = tensor.detach().contiguous().cpu()
    header = {str(k): str(v) for k, v in (metadata or {}).items()}
    if HEADER_KEY in header:
        raise FormatError(f"{path}: metadata key {HEADER_KEY!r} is reserved")
    header[HEADER_KEY] = json.dumps(metas, sort_keys=True)
    with atomic_file(path) as tmp:
        save_file(tensors, str(tmp), metadata=header)


def load_packed(
    path: str | Path, device: str | torch.device = "cpu"
) -> tuple[dict[str, PackedWeight], dict[str, str]]:
    """Read a file written by :func:`save_packed`: (layers by name, the other header metadata)."""
    path = Path(path)

    try:
        with safe_open(str(path), framework="pt") as fh:
            header = dict(fh.metadata() or {})
        flat = load_file(str(path), device=str(device))
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise PackedFileError(
            f"{path}: cannot be read as safetensors ({exc}); truncated or damaged"
        ) from None
    return decode_packed(flat, header, path)


def decode_packed(
    flat: Mapping[str, torch.Tensor], header: Mapping[str, str], path: str | Path = "packed file"
) -> tuple[dict[str, PackedWeight], dict[str, str]]:
    """The layers held by a packed file's tensors and header (read by whoever opened the file)."""
    header = dict(header)
    if HEADER_KEY not in header:
        raise PackedFileError(
            f"{path}: not a trilm packed file (no {HEADER_KEY!r} in the safetensors header)"
        )
    try:
        metas = json.loads(header.pop(HEADER_KEY))
    except (ValueError, RecursionError) as exc:
        raise PackedFileError(f"{path}: header {HEADER_KEY!r} is not valid JSON: {exc}") from None
    if not isinstance(metas, dict) or not all(isinstance(m, dict) for m in metas.values()):
        raise PackedFileError(f"{path}: header {HEADER_KEY!r} is not an object of per-layer meta objects")
    layers: dict[str, PackedWeight] = {}
    claimed: set[str] = set()
    for name, meta in metas.items():
        prefix = f"{name}."
        tensors = {
            k[len(prefix) :]: v
            for k, v in flat.items()
            if k.startswith(prefix) and "." not in k[len(prefix) :]
        }
        claimed.update(prefix + k for k in tensors)
        try:
            layers[name] = from_tensors(tensors, meta)
        except (FormatError, KeyError, TypeError, ValueError, OverflowError, RuntimeError) as exc:
            raise PackedFileError(f"{path}: layer {name!r}: {exc}") from None
    stray = sorted(set(flat) - claimed)
    if stray:
        raise PackedFileError(f"{path}: tensors that belong to no layer: {stray[:5]}")
    return layers, header
