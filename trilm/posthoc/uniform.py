"""The uniform min/max grid as GPTQ, RTN and OmniQuant use it, on top of trilm.formats' one quantizer.

:func:`trilm.formats.fit_uniform_grid` / :func:`trilm.formats.quantize_to_grid` are the grid; this module
adds what the methods share around it: their config (:class:`UniformConfig`), fitting a grid in the
precision its scale is stored with (:func:`fit_grid`), dequantization, and packing the chosen codes into an
:class:`~trilm.formats.IntWeight` (with ``g_idx`` when act-order scatters the groups over K).

``target`` chooses the grid: ``int`` is GPTQ's min/max grid; ``gguf-q4_0``/``gguf-q4_1``/``gguf-q8_0`` are
llama.cpp's block grids (:mod:`trilm.formats.ggml`), whose fp16 numbers are rounded before the codes are
chosen, so GPTQ's error feedback works on the grid the GGUF file holds and ``trilm export gguf`` writes the
QuantLM's values unchanged.
"""

from __future__ import annotations

import dataclasses

import torch

from trilm.config import Config, ConfigError, require
from trilm.formats import (
    GGML_TYPES,
    IntWeight,
    fit_ggml_grid,
    fit_uniform_grid,
    ggml_codes,
    ggml_values,
    gptq_bits,
    quantize_to_grid,
)
from trilm.formats.intk import INT_BITS

GROUP_FITS = ("exact", "nearest")
KERNEL_GROUP_UNIT = 32
"""Group sizes the packed kernels run natively are multiples of 32 (``trilm.kernels`` CPU int4: 32…256)."""
GRID_BITS = (2, 3, 4, 8)
"""Bit widths the uniform methods quantize to (``IntWeight`` stores all of them)."""
GGUF_TARGETS = {f"gguf-{name}": t for name, t in GGML_TYPES.items()}
TARGETS = ("int", *GGUF_TARGETS)
GGUF_GROUP = 32


@dataclasses.dataclass
class UniformConfig(Config):
    """Settings of the uniform-grid layer methods; defaults are the reference GPTQ's (``llama.py``)."""

    bits: int = 4
    group_size: int = -1
    """Input columns per scale/zero group; -1 = one grid per output row."""
    sym: bool = False
    """Symmetric grid: zero fixed at (maxq + 1) / 2 (3-bit levels −4…+3)."""
    act_order: bool = False
    """Quantize columns by descending diag(H) (GPTQ ``--act-order``); undone in the result."""
    static_groups: bool = False
    """Fit every group's grid on the original W up front, in original column order (instead of at the
    group's first column on the error-updated W)."""
    blocksize: int = 128
    """Columns per lazy-batch block of the GPTQ loop (only changes speed, up to float rounding)."""
    percdamp: float = 0.01
    """Damping λ = percdamp · mean(diag H)."""
    group_fit: str = "exact"
    """What a ``group_size`` that does not divide a layer's K does: ``exact`` refuses (naming the group
    sizes that do divide), ``nearest`` uses, for that layer, the divisor of K nearest ``group_size``
    (:func:`nearest_group`); every layer's packed weight records its own group size."""
    target: str = "int"
    """The grid: ``int`` (GPTQ's min/max grid) or a llama.cpp block type, ``gguf-q4_0`` (symmetric 4-bit),
    ``gguf-q4_1`` (4-bit with an fp16 min) or ``gguf-q8_0`` (symmetric 8-bit), which fixes bits, sym and
    group size 32 (``trilm quantize --target`` fills them in; a conflicting value is refused)."""

    @classmethod
    def implied_settings(cls, values: dict) -> dict:
        """The settings a ``target`` fixes (bits, group_size, sym), for options the user left out."""
        t = GGUF_TARGETS.get(values.get("target", "int"))
        return {} if t is None else {"bits": t.bits, "group_size": GGUF_GROUP, "sym": not t.has_min}

    def validate(self) -> None:
        require(self.bits in GRID_BITS, f"bits: must be one of {list(GRID_BITS)}, got {self.bits}")
        require(self.group_fit in GROUP_FITS, f"group_fit: one of {list(GROUP_FITS)}, got {self.group_fit!r}")
        require(
            self.group_size == -1 or self.group_size > 0,
            f"group_size: must be -1 (per row) or > 0, got {self.group_size}",
        )
        require(self.blocksize > 0, f"blocksize: must be > 0, got {self.blocksize}")
        require(self.percdamp >= 0, f"percdamp: must be >= 0, got {self.percdamp}")
        require(
            not self.static_groups or self.group_size > 0,
            "static_groups: needs group_size > 0 (per-row grids have no groups to fix)",
        )
        require(self.target in TARGETS, f"target: one of {list(TARGETS)}, got {self.target!r}")
        t = GGUF_TARGETS.get(self.target)
        if t is not None:
            want = {"bits": t.bits, "group_size": GGUF_GROUP, "sym": not t.has_min, "group_fit": "exact"}
            for field, value in want.items():
                require(
                    getattr(self, field) == value,
                    f"{field}: target {self.target} is llama.cpp's {t.name.upper()} grid, which has "
                    f"{field}={value}; got {getattr(self, field)}",
                )
            require(
                not self.act_order or self.static_groups,
                f"act_order: target {self.target}: llama.cpp blocks are consecutive columns, so act-order "
                "needs static_groups (no g_idx)",
            )

    @property
    def ggml(self) -> str | None:
        """The llama.cpp type name of the target (None for the int grid)."""
        t = GGUF_TARGETS.get(self.target)
        return None if t is None else t.name

    def paper_bits(self) -> float:
        """GPTQ's count: b + (16-bit scale + b-bit zero) / g per weight; per row ≈ b."""
        return gptq_bits(self.bits, self.group_size if self.group_size > 0 else None)

    def check_weight(self, W: torch.Tensor, name: str = "layer") -> int:
        """Raise when W's input size does not split into groups; returns the effective group size."""
        return self.check_in_features(W.shape[1], name)

    def check_in_features(self, k: int, name: str = "layer") -> int:
        return group_width(k, self.group_size, name, self.group_fit)

    def unpackable(self) -> str | None:
        """Why a QuantLM cannot store this setting (None: it can)."""
        if self.bits not in INT_BITS:
            return (
                f"bits={self.bits}: trilm.formats.IntWeight stores {list(INT_BITS)}-bit grids, so an "
                f"{self.bits}-bit QuantLM cannot be written (quantize_layer still computes it)"
            )
        return None


def group_width(k: int, group_size: int, name: str = "layer", fit: str = "exact") -> int:
    """Input columns per scale group of a K-column weight (``group_size``, or K for -1 = per row).

    A group that does not divide K is refused, naming the layer and the group sizes that would divide
    (``fit="exact"``), or replaced by the divisor of K nearest to it (``fit="nearest"``)."""
    g = k if group_size == -1 else group_size
    if k % g == 0:
        return g
    if fit == "nearest":
        return nearest_group(k, g)
    raise ConfigError(
        f"{name}: group_size={g} does not divide in_features K={k}; {divisor_hint(k, g)} (or -1 per row, "
        f"or --group-fit nearest: {nearest_group(k, g)} for this K)"
    )


def divisors(k: int) -> list[int]:
    return [d for d in range(1, k + 1) if k % d == 0]


def nearest_group(k: int, g: int) -> int:
    """The group size a K-column layer uses for a requested ``g`` that does not divide K: the divisor of K
    nearest ``g`` among the multiples of :data:`KERNEL_GROUP_UNIT` (what the packed kernels run), any
    divisor when K has none; ties go to the smaller (more scales, finer grid)."""
    candidates = [d for d in divisors(k) if d % KERNEL_GROUP_UNIT == 0] or divisors(k)
    return min(candidates, key=lambda d: (abs(d - g), d))


def divisor_hint(k: int, g: int) -> str:
    """The group sizes near ``g`` that divide K, in words."""
    below = [d for d in divisors(k) if d < g]
    above = [d for d in divisors(k) if d > g]
    near = [*below[-1:], *above[:1]]
    aligned = [d for d in divisors(k) if d % KERNEL_GROUP_UNIT == 0]
    text = f"divisors of {k} near {g}: {', '.join(map(str, near))}"
    if aligned:
        text += f"; multiples of {KERNEL_GROUP_UNIT} dividing {k}: {', '.join(map(str, aligned))}"
    return text


def stored(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` (float32) rounded to its stored precision: the method computes with what the file keeps."""
    return t.to(dtype).float() if dtype != torch.float32 else t


def fit_grid(
    w: torch.Tensor, bits: int, sym: bool, scale_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (scale, zero) of ``w`` (rows, cols), the scale rounded to ``scale_dtype`` (fp32 = exact)."""
    scale, zero = fit_uniform_grid(w, bits, sym)
    if scale_dtype != torch.float32:
        tiny = torch.finfo(scale_dtype).tiny
        scale = scale.clamp(min=tiny).to(scale_dtype).float()
    return scale, zero


Grid = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]
"""Per-row (scale, zero, mins or None) of a fitted grid, fp32 holding the stored values."""


def fit_target(w: torch.Tensor, cfg: UniformConfig, scale_dtype: torch.dtype) -> Grid:
    """The grid of ``w`` (rows, cols) that ``cfg.target`` asks for, its numbers as they will be stored."""
    if cfg.ggml is not None:
        return fit_ggml_grid(w, cfg.ggml)
    scale, zero = fit_grid(w, cfg.bits, cfg.sym, scale_dtype)
    return scale, zero, None


def grid_codes(w: torch.Tensor, grid: Grid, cfg: UniformConfig) -> torch.Tensor:
    """Codes of ``w`` on a per-row grid from :func:`fit_target` (llama.cpp's grids may have zero or negative
    scales, which :func:`~trilm.formats.ggml_codes` handles)."""
    scale, zero, mins = grid
    if cfg.ggml is None:
        return quantize_to_grid(w, scale, zero, cfg.bits)
    return ggml_codes(w, scale, zero, mins, cfg.bits)


def grid_values(codes: torch.Tensor, grid: Grid) -> torch.Tensor:
    """The fp32 values of codes on a per-row grid: exactly what the packed weight dequantizes to."""
    return ggml_values(codes, *grid)


def check_target_storage(cfg: UniformConfig, scale_dtype: torch.dtype, name: str) -> None:
    """A llama.cpp target stores fp16 numbers; any other scale precision is refused, naming the option."""
    if cfg.ggml is not None and scale_dtype != torch.float16:
        raise ConfigError(
            f"{name}: scale_dtype {scale_dtype}: target {cfg.target} stores fp16 scales (llama.cpp's "
            "blocks); use --scale-dtype float16"
        )


def dequantize_codes(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """s · (codes − z) for per-row ``scale``/``zero`` (rows,) broadcast over columns; float32."""
    shape = (-1, *([1] * (codes.dim() - 1)))
    return scale.reshape(shape) * (codes.float() - zero.reshape(shape))


def quantize_column(
    w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes uint8 (rows,), dequantized float32 (rows,)) of one column on per-row grids."""
    codes = quantize_to_grid(w, scale, zero, bits)  # 1-D: per-row grids are elementwise here
    return codes, scale * (codes.float() - zero)


def pack_int(
    codes: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bits: int,
    g_idx: torch.Tensor | None,
    scale_dtype: torch.dtype,
    mins: torch.Tensor | None = None,
) -> tuple[IntWeight | None, str | None]:
    """IntWeight from codes (N, K), per-group tables (K / g, N), optional g_idx and mins; or (None, why)."""
    if bits not in INT_BITS:
        return None, (
            f"{bits}-bit codes cannot be stored: trilm.formats.IntWeight holds {list(INT_BITS)}-bit grids"
        )
    packed = IntWeight.pack(codes, scales, zeros, bits, g_idx=g_idx, scale_dtype=scale_dtype, mins=mins)
    return packed, None
