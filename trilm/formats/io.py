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
from safetensors.torch import load_file, save_file

from trilm.atomic import atomic_file
from trilm.formats.base import FormatError, PackedWeight, from_tensors

HEADER_KEY = "trilm.packed"


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
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        header = dict(fh.metadata() or {})
    return decode_packed(load_file(str(path), device=str(device)), header, path)


def decode_packed(
    flat: Mapping[str, torch.Tensor], header: Mapping[str, str], path: str | Path = "packed file"
) -> tuple[dict[str, PackedWeight], dict[str, str]]:
    """The layers held by a packed file's tensors and header (read by whoever opened the file)."""
    header = dict(header)
    if HEADER_KEY not in header:
        raise FormatError(f"{path}: not a trilm packed file (no {HEADER_KEY!r} in the safetensors header)")
    try:
        metas = json.loads(header.pop(HEADER_KEY))
    except json.JSONDecodeError as exc:
        raise FormatError(f"{path}: header {HEADER_KEY!r} is not valid JSON: {exc}") from None
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
        except FormatError as exc:
            raise FormatError(f"{path}: layer {name!r}: {exc}") from None
    stray = sorted(set(flat) - claimed)
    if stray:
        raise FormatError(f"{path}: tensors that belong to no layer: {stray[:5]}")
    return layers, header
