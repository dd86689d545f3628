"""The per-layer contract and the method registry: ``quantize_weight(method, W, H, **cfg) -> QuantResult``.

A *layer method* turns one float weight W (N outputs × K inputs, as ``nn.Linear``) and the Hessian H of its
inputs into a dequantized weight, the packed weight the kernels serve, and the proxy loss tr(ΔW H ΔWᵀ).
Each method registers itself with :func:`register_method` under a name together with the typed config it
accepts, so the block-wise driver, the CLI and the tests reach every method the same way, and a new method
(PB-LLM, BiLLM, STBLLM) plugs in by registering — nothing else changes.

``quantize_weight`` takes exactly the method's config keys (GPTQ/RTN: bits, group_size, sym, act_order,
static_groups, blocksize, percdamp). How the scales are *stored* is not a quantization setting but a storage
one (:class:`LayerOptions`); it defaults to fp32, which reproduces the reference code bit for bit. The QuantLM
writer asks for fp16 scales: the grid is then fitted with the scale it will be stored with, so the packed
weight dequantizes to exactly ``QuantResult.weight``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

from trilm.config import Config, ConfigError
from trilm.formats import PackedWeight

SCALE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclasses.dataclass
class QuantResult:
    """What a layer method returns for one weight."""

    weight: torch.Tensor
    """Dequantized float32 weight (N, K), rows = outputs, in the original column order."""
    packed: PackedWeight | None
    """The trilm.formats packed weight (``IntWeight`` with scales, zeros and g_idx for the uniform grid);
    None only when the format cannot store the setting, and then ``packed_error`` says why."""
    proxy_loss: float
    """tr((weight − W) H (weight − W)ᵀ) in float64 with the H that was passed in (undamped); NaN when
    no H was given (methods that do not need one)."""
    method: str
    config: dict[str, Any]
    seconds: float = 0.0
    damp: float | None = None
    """Absolute damping λ added to diag H (None for methods that do not invert H)."""
    damp_retries: int = 0
    """How often λ had to be multiplied by 10 before H + λI was positive definite."""
    packed_error: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Method-specific details (e.g. act-order permutation, salient fractions)."""


@dataclasses.dataclass(frozen=True)
class LayerOptions:
    """Storage and reporting options that do not change the quantization algorithm."""

    scale_dtype: torch.dtype = torch.float32
    """Precision the grid scales are stored in; the grid is fitted with scales rounded to it."""
    name: str = "layer"
    """Used in warnings and errors (canonical weight name in the driver)."""
    need_packed: bool = False
    """Raise instead of returning ``packed=None`` when the format cannot store the result."""


LayerFn = Callable[[torch.Tensor, torch.Tensor, Any, LayerOptions], QuantResult]


@dataclasses.dataclass(frozen=True)
class LayerMethod:
    name: str
    config_cls: type[Config]
    fn: LayerFn
    description: str
    paper_bits: Callable[[Any], float] | None = None
    """Bits per weight as the method's paper counts them (a trilm.formats.accounting function)."""
    unwritable: Callable[[Any], str | None] | None = None
    """Why a QuantLM with this config cannot be written (None: it can); checked before any work."""
    needs_hessian: bool = True
    """False: the method ignores H (the driver then collects none and passes None; no proxy loss)."""

    def config(self, **cfg: Any) -> Config:
        """The method's typed config from keyword settings (unknown keys name the method)."""
        try:
            return self.config_cls.from_dict(dict(cfg))
        except ConfigError as exc:
            raise ConfigError(f"{self.name}: {exc}") from None


METHODS: dict[str, LayerMethod] = {}


def register_method(
    name: str,
    config_cls: type[Config],
    description: str,
    paper_bits: Callable[[Any], float] | None = None,
    unwritable: Callable[[Any], str | None] | None = None,
    needs_hessian: bool = True,
) -> Callable[[LayerFn], LayerFn]:
    """Decorator: make ``fn(W, H, cfg, opts) -> QuantResult`` reachable as ``quantize_weight(name, ...)``
    (and as ``trilm quantize --method name``, its config fields becoming command-line options)."""

    def wrap(fn: LayerFn) -> LayerFn:
        if name in METHODS:
            raise ValueError(f"layer method {name!r} registered twice")
        METHODS[name] = LayerMethod(name, config_cls, fn, description, paper_bits, unwritable, needs_hessian)
        return fn

    return wrap


def get_method(name: str) -> LayerMethod:
    if name not in METHODS:
        raise ConfigError(f"unknown post-hoc method {name!r}; known layer methods: {sorted(METHODS)}")
    return METHODS[name]


def run_layer_method(
    method: str, W: torch.Tensor, H: torch.Tensor, cfg: Config, opts: LayerOptions | None = None
) -> QuantResult:
    """Run a registered method with an already-built config (the driver's entry point)."""
    m = get_method(method)
    if not isinstance(cfg, m.config_cls):
        raise TypeError(f"{method}: expected a {m.config_cls.__name__}, got {type(cfg).__name__}")
    opts = opts or LayerOptions()
    if W.dim() != 2 or not W.is_floating_point():
        raise ConfigError(f"{opts.name}: expected a 2-D float weight, got {W.dtype} {tuple(W.shape)}")
    if not bool(torch.isfinite(W).all()):
        raise ConfigError(f"{opts.name}: the weight contains inf or NaN")
    start = time.perf_counter()
    result = m.fn(W, H, cfg, opts)
    result.seconds = time.perf_counter() - start
    if opts.need_packed and result.packed is None:
        raise ConfigError(f"{opts.name}: {result.packed_error}")
    return result


def quantize_weight(method: str, W: torch.Tensor, H: torch.Tensor, **cfg: Any) -> QuantResult:
    """Quantize one weight W (N, K) given its input Hessian H (K, K) with a registered method.

    ``quantize_weight("gptq", W, H, bits=4, group_size=128, act_order=True)``; omitted keys take the
    method's defaults (the reference code's). Unknown keys and values the method cannot represent raise
    :class:`~trilm.config.ConfigError` naming them.
    """
    m = get_method(method)
    return run_layer_method(method, W, H, m.config(**cfg))
