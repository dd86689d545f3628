"""Reading and writing the safetensors files of model directories, with errors that name file and tensor.

A truncated or foreign file raises :class:`~trilm.store.errors.IntegrityError` naming it (not safetensors'
bare ``SafetensorError``), and a float tensor holding NaN or ±inf is refused by name: a weight that is not
a number is never a trained one, and everything computed from it would be silently wrong.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from trilm.atomic import atomic_file
from trilm.store.errors import IntegrityError


def _unreadable(path: Path, exc: BaseException) -> IntegrityError:
    return IntegrityError(f"{path}: cannot be read as safetensors ({exc}); the file is truncated or damaged")


def read_header(path: str | Path) -> tuple[list[str], dict[str, str]]:
    """(tensor names, string metadata) of a safetensors file, without reading the tensors."""

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as fh:
            return list(fh.keys()), dict(fh.metadata() or {})
    except (SafetensorError, OSError) as exc:
        raise _unreadable(path, exc) from None


def check_finite(path: str | Path, name: str, tensor: torch.Tensor) -> None:
    """Raise naming the file and tensor when a floating-point tensor holds NaN or ±inf."""
    if not tensor.is_floating_point() or tensor.numel() == 0:
        return
    low, high = torch.aminmax(tensor)  # NaN propagates, ±inf is an extreme: one pass, no temporary
    if bool(torch.isfinite(low) & torch.isfinite(high)):
        return
    finite = torch.isfinite(tensor)
    bad = int((~finite).sum())
    first = tuple(int(i) for i in torch.nonzero(~finite)[0].tolist())
    value = float(tensor[first])
    raise IntegrityError(
        f"{path}: tensor {name} holds {bad:,} non-finite value(s) ({value} at index {list(first)}); "
        "refusing to use a corrupted weight"
    )


def read_tensors(
    path: str | Path, names: Iterable[str] | None = None, *, finite: bool = True
) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors file (all, or ``names``), each checked to be finite unless told not to."""

    path = Path(path)
    out: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(path), framework="pt") as fh:
            present = list(fh.keys())
            wanted = present if names is None else list(names)
            missing = sorted(set(wanted) - set(present))
            if missing:
                raise IntegrityError(f"{path}: tensor(s) {missing[:5]} are not in this file")
            for name in wanted:
                out[name] = fh.get_tensor(name)
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise _unreadable(path, exc) from None
    if finite:
        for name, tensor in out.items():
            check_finite(path, name, tensor)
    return out


def write_tensors(
    path: str | Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> Path:
    """Write contiguous CPU copies of ``tensors`` to ``path`` atomically."""

    path = Path(path)
    with atomic_file(path) as tmp:
        save_file(
            {k: v.detach().contiguous().cpu() for k, v in tensors.items()},
            str(tmp),
            metadata=dict(metadata) if metadata else None,
        )
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # safetensors creates its files private; a model file is not
    return path
