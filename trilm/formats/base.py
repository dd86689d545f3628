"""The packed-weight contract shared by every format: tensors + JSON metadata, bits/weight, dequantize.

A :class:`PackedWeight` is what one linear layer stores. It serializes to a flat ``dict[str, Tensor]`` (what
a safetensors file holds) plus a small JSON-able ``meta()`` dict that names the format and its integer
settings, so export, the kernels and the serving engine all read the same objects back with
:func:`from_tensors`. Weights are (out_features N, in_features K), as in ``nn.Linear``; ``dequantize()`` is
the format's exact float value in pure torch, which the kernels' tests and the CPU fallback use as the
reference.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar, Self

import torch

from trilm.formats.decode import DecodeArgs

FORMATS: dict[str, type[PackedWeight]] = {}
SCALE_DTYPE = torch.float16
"""The precision packed weights store their float scales (and offsets) in unless asked otherwise."""


class FormatError(ValueError):
    """A packed tensor or setting is inconsistent; the message names the format and the field."""


def register(cls: type[PackedWeight]) -> type[PackedWeight]:
    """Class decorator: make a format readable by :func:`from_tensors` under ``cls.FORMAT``."""
    if cls.FORMAT in FORMATS:
        raise FormatError(f"format {cls.FORMAT!r} registered twice")
    FORMATS[cls.FORMAT] = cls
    return cls


@dataclasses.dataclass(eq=False)
class PackedWeight(abc.ABC):
    """Base of every packed format. Subclasses are dataclasses whose Tensor fields are listed in TENSORS."""

    FORMAT: ClassVar[str] = ""
    TENSORS: ClassVar[tuple[str, ...]] = ()
    OPTIONAL_TENSORS: ClassVar[tuple[str, ...]] = ()
    SETTINGS: ClassVar[tuple[str, ...]] = ()

    out_features: int
    in_features: int

    def __post_init__(self) -> None:
        for name in ("out_features", "in_features"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise FormatError(f"{self.FORMAT}.{name}: expected a positive int, got {value!r}")
        for name in self.TENSORS:
            if not isinstance(getattr(self, name), torch.Tensor):
                raise FormatError(f"{self.FORMAT}.{name}: expected a tensor, got {type(getattr(self, name))}")
        for name in self.OPTIONAL_TENSORS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, torch.Tensor):
                raise FormatError(f"{self.FORMAT}.{name}: expected a tensor or None, got {type(value)}")
        self.validate()

    # -- per-format ---------------------------------------------------------------------------------------
    def validate(self) -> None:  # noqa: B027 - optional hook: formats without extra checks inherit it
        """Raise :class:`FormatError` naming the field when shapes, dtypes or settings disagree."""

    @abc.abstractmethod
    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight (N, K) this packed weight stands for, computed in fp32 then cast."""

    def kernel_layout(self) -> PackedWeight:
        """The packed weight the kernels read: this one, or — for compact storage formats that no kernel
        decodes in place — the same weight converted once into a kernel format (exact, same dequantize)."""
        return self

    def decode_args(self) -> DecodeArgs:
        """The kernel id this format's codes need and its tensors by role (:mod:`trilm.formats.decode`).
        Compact storage formats, which no kernel decodes in place, raise: use :meth:`kernel_layout`."""
        raise FormatError(f"{self.FORMAT}: no kernel decodes this layout in place; use kernel_layout()")

    def affine_layout(self) -> PackedWeight | None:
        """This weight in a format with an affine decode (ternary, binary, int), exact — itself, a copy
        converted once, or None when its values follow no affine rule."""
        layout = self.kernel_layout()
        return layout if layout.decode_args().affine else None

    # -- shared -------------------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    @property
    def device(self) -> torch.device:
        return getattr(self, self.TENSORS[0]).device

    def to_tensors(self) -> dict[str, torch.Tensor]:
        """Every stored tensor by field name (optional ones only when present)."""
        out = {name: getattr(self, name) for name in self.TENSORS}
        out.update({n: getattr(self, n) for n in self.OPTIONAL_TENSORS if getattr(self, n) is not None})
        return out

    def meta(self) -> dict[str, Any]:
        """JSON-able description: format name, shape, settings and the storage bits per weight."""
        out: dict[str, Any] = {
            "format": self.FORMAT,
            "out_features": self.out_features,
            "in_features": self.in_features,
        }
        out.update({name: getattr(self, name) for name in self.SETTINGS})
        out["bits_per_weight"] = round(self.bits_per_weight(), 6)
        return out

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Self:
        """Rebuild from :meth:`to_tensors` output and :meth:`meta`; unknown or missing keys raise."""
        fmt = meta.get("format", cls.FORMAT)
        if fmt != cls.FORMAT:
            raise FormatError(f"{cls.FORMAT}: meta names format {fmt!r}")
        missing = [n for n in cls.TENSORS if n not in tensors]
        if missing:
            raise FormatError(f"{cls.FORMAT}: missing tensor(s) {missing}")
        unknown = sorted(set(tensors) - set(cls.TENSORS) - set(cls.OPTIONAL_TENSORS))
        if unknown:
            raise FormatError(f"{cls.FORMAT}: unknown tensor(s) {unknown}")
        kwargs: dict[str, Any] = {}
        for name in ("out_features", "in_features", *cls.SETTINGS):
            if name not in meta:
                raise FormatError(f"{cls.FORMAT}: meta lacks {name!r}")
            kwargs[name] = meta[name]
        kwargs.update({n: tensors[n] for n in cls.TENSORS})
        kwargs.update({n: tensors.get(n) for n in cls.OPTIONAL_TENSORS})
        return cls(**kwargs)

    def to(self, device: torch.device | str) -> Self:
        """A copy whose tensors live on ``device`` (dtypes unchanged)."""
        moved = {n: t.to(device) for n, t in self.to_tensors().items()}
        return dataclasses.replace(self, **moved)

    def storage_bits(self) -> int:
        """Bits of everything stored for this layer: codes, scales, zeros, masks, indices."""
        return sum(t.numel() * t.element_size() * 8 for t in self.to_tensors().values())

    def bits_per_weight(self) -> float:
        """Storage bits divided by N·K: the honest bits/weight, metadata included."""
        return self.storage_bits() / (self.out_features * self.in_features)

    def __repr__(self) -> str:
        settings = ", ".join(f"{n}={getattr(self, n)}" for n in self.SETTINGS)
        extra = f", {settings}" if settings else ""
        return (
            f"{type(self).__name__}({self.out_features}x{self.in_features}{extra}, "
            f"{self.bits_per_weight():.3f} bits/weight)"
        )


def from_tensors(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> PackedWeight:
    """Rebuild any registered format from its tensors and meta (``meta['format']`` selects the class)."""
    fmt = meta.get("format")
    if fmt not in FORMATS:
        raise FormatError(f"unknown packed format {fmt!r}; known: {sorted(FORMATS)}")
    return FORMATS[fmt].from_tensors(tensors, meta)


# -- validation helpers used by the formats ------------------------------------------------------------
def check_int32_words(fmt: str, name: str, t: torch.Tensor, rows: int, n: int) -> None:
    if t.dtype != torch.int32 or tuple(t.shape) != (rows, n):
        raise FormatError(
            f"{fmt}.{name}: expected int32 of shape ({rows}, {n}), got {t.dtype} {tuple(t.shape)}"
        )


def check_group_table(
    fmt: str, name: str, t: torch.Tensor, k: int, n: int, *, rows: int | None = None
) -> int:
    """A (K // g, N) float table of per-group values; returns g."""
    if not t.is_floating_point() or t.dim() != 2 or t.shape[1] != n or t.shape[0] == 0:
        raise FormatError(
            f"{fmt}.{name}: expected a float tensor of shape (K // group_size, {n}), "
            f"got {t.dtype} {tuple(t.shape)}"
        )
    if rows is not None and t.shape[0] != rows:
        raise FormatError(f"{fmt}.{name}: expected {rows} group rows, got {t.shape[0]}")
    if k % t.shape[0]:
        raise FormatError(f"{fmt}.{name}: {t.shape[0]} groups do not divide in_features={k}")
    if not bool(torch.isfinite(t).all()):
        raise FormatError(f"{fmt}.{name}: contains inf or nan")
    return k // t.shape[0]


def expand_groups(table: torch.Tensor, k: int) -> torch.Tensor:
    """(K // g, N) per-group table → (N, K) per-weight values in fp32."""
    return table.float().repeat_interleave(k // table.shape[0], dim=0).t()
