"""The post-hoc methods, registered once: the per-layer contract and every method ``trilm quantize`` runs.

A **layer method** (RTN, GPTQ, PB-LLM, BiLLM, STBLLM) turns one float weight W (N outputs × K inputs, as
``nn.Linear``) and the Hessian H of its inputs into a dequantized weight, the packed weight the kernels
serve, and the proxy loss tr(ΔW H ΔWᵀ): ``quantize_layer(method, W, H, **cfg) -> QuantResult``. It
registers its function with :func:`register_method`, together with the typed config it accepts; the
block-wise engine then drives it over a whole model (:class:`~trilm.posthoc.layerwise.LayerwiseMethod`).
A method that needs more than one layer at a time names its own whole-model **driver**: a block method
(OmniQuant trains through whole blocks) registers only a driver (:func:`register_block_method`); a layer
method may add one (:func:`set_driver`: PB-LLM's QAT, STBLLM's adaptive N) and keeps its per-layer
function. Either way there is one entry per name in :data:`METHODS`, and the method's config dataclass is
the single description of its settings: ``trilm quantize`` turns its fields into options, the QuantLM
records them, and validation errors name them.

How the scales are *stored* is not a quantization setting but a storage one (:class:`LayerOptions`,
:class:`MethodOptions`): :data:`~trilm.formats.SCALE_DTYPE` (fp16) by default, so the grid is fitted with
the scale it will be stored with and the packed weight dequantizes to exactly ``QuantResult.weight``.
:func:`quantize_layer` is the reference-reproducing entry and keeps scales in fp32 (bit for bit the
reference code's).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from trilm.config import Config, ConfigError
from trilm.formats import SCALE_DTYPE, PackedWeight

if TYPE_CHECKING:
    from trilm.posthoc.engine import BlockMethod


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
    """Storage and reporting options of one layer that do not change the quantization algorithm."""

    scale_dtype: torch.dtype = SCALE_DTYPE
    """Precision the grid scales are stored in; the grid is fitted with scales rounded to it."""
    name: str = "layer"
    """Used in warnings and errors (canonical weight name in the driver)."""
    need_packed: bool = False
    """Raise instead of returning ``packed=None`` when the format cannot store the result."""


@dataclasses.dataclass(frozen=True)
class MethodOptions:
    """Driver-level settings every whole-model method may use."""

    true_sequential: bool = False
    scale_dtype: torch.dtype = SCALE_DTYPE
    seed: int = 0
    calibration: Any = None
    """The job's CalibrationConfig (methods that train, PB-LLM's QAT, read their text from its source)."""
    tokenizer: Any = None
    """The model's tokenizer, for methods that read raw text."""


LayerFn = Callable[[torch.Tensor, torch.Tensor | None, Any, LayerOptions], QuantResult]
Driver = Callable[[Any, MethodOptions], "BlockMethod"]


@dataclasses.dataclass(frozen=True)
class Method:
    """One registered post-hoc method."""

    name: str
    config_cls: type[Config]
    description: str
    paper_bits: Callable[[Any], float] | None = None
    """Bits per weight as the method's paper counts them (a trilm.formats.accounting function)."""
    unwritable: Callable[[Any], str | None] | None = None
    """Why a QuantLM with this config cannot be written (None: it can); checked before any work."""
    layer_fn: LayerFn | None = None
    """The per-layer function (None for a block method)."""
    needs_hessian: bool = True
    """False: the layer function ignores H (the driver then collects none and passes None)."""
    driver: Driver | None = None
    """Builds the whole-model driver; None: the layer function applied to every block linear."""

    @property
    def data_free(self) -> bool:
        """Runs without calibration data: a layer method that ignores H, driven layer by layer."""
        return self.layer_fn is not None and not self.needs_hessian and self.driver is None

    def config(self, **values: Any) -> Config:
        """The method's typed config from keyword settings (unknown keys name the method)."""
        try:
            return self.config_cls.from_dict(dict(values))
        except ConfigError as exc:
            raise ConfigError(f"--method {self.name}: {exc}") from None


METHODS: dict[str, Method] = {}


def _register(method: Method) -> Method:
    if method.name in METHODS:
        raise ValueError(f"post-hoc method {method.name!r} registered twice")
    METHODS[method.name] = method
    return method


def register_method(
    name: str,
    config_cls: type[Config],
    description: str,
    paper_bits: Callable[[Any], float] | None = None,
    unwritable: Callable[[Any], str | None] | None = None,
    needs_hessian: bool = True,
) -> Callable[[LayerFn], LayerFn]:
    """Decorator: make ``fn(W, H, cfg, opts) -> QuantResult`` reachable as ``quantize_layer(name, ...)``
    and as ``trilm quantize --method name`` (its config fields becoming command-line options)."""

    def wrap(fn: LayerFn) -> LayerFn:
        _register(Method(name, config_cls, description, paper_bits, unwritable, fn, needs_hessian))
        return fn

    return wrap


def register_block_method(
    name: str,
    config_cls: type[Config],
    driver: Driver,
    description: str,
    paper_bits: Callable[[Any], float] | None = None,
    unwritable: Callable[[Any], str | None] | None = None,
) -> Method:
    """Register a method that exists only as a whole-model driver (it has no per-layer function)."""
    return _register(Method(name, config_cls, description, paper_bits, unwritable, driver=driver))


def set_driver(name: str, driver: Driver, note: str) -> Method:
    """Give the registered layer method ``name`` its own whole-model driver; ``note`` extends its
    description with what the driver adds."""
    method = get_method(name)
    if method.driver is not None:
        raise ValueError(f"post-hoc method {name!r} already has a whole-model driver")
    METHODS[name] = dataclasses.replace(method, driver=driver, description=f"{method.description}; {note}")
    return METHODS[name]


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ConfigError(f"unknown post-hoc method {name!r}; choose from {sorted(METHODS)}")
    return METHODS[name]


def run_layer_method(
    method: str, W: torch.Tensor, H: torch.Tensor | None, cfg: Config, opts: LayerOptions
) -> QuantResult:
    """Run a registered layer method with an already-built config (the driver's entry point)."""
    m = get_method(method)
    if m.layer_fn is None:
        raise ConfigError(f"{method}: a block method (it trains through whole blocks), not a layer method")
    if not isinstance(cfg, m.config_cls):
        raise TypeError(f"{method}: expected a {m.config_cls.__name__}, got {type(cfg).__name__}")
    if W.dim() != 2 or not W.is_floating_point():
        raise ConfigError(f"{opts.name}: expected a 2-D float weight, got {W.dtype} {tuple(W.shape)}")
    if not bool(torch.isfinite(W).all()):
        raise ConfigError(f"{opts.name}: the weight contains inf or NaN")
    start = time.perf_counter()
    result = m.layer_fn(W, H, cfg, opts)
    result.seconds = time.perf_counter() - start
    if opts.need_packed and result.packed is None:
        raise ConfigError(f"{opts.name}: {result.packed_error}")
    return result


def quantize_layer(method: str, W: torch.Tensor, H: torch.Tensor | None, **cfg: Any) -> QuantResult:
    """Quantize one weight W (N, K) given its input Hessian H (K, K) with a registered layer method.

    ``quantize_layer("gptq", W, H, bits=4, group_size=128, act_order=True)``; omitted keys take the
    method's defaults (the reference code's), and scales stay in fp32, so the result is the reference's.
    Unknown keys and values the method cannot represent raise :class:`~trilm.config.ConfigError` naming
    them.
    """
    m = get_method(method)
    return run_layer_method(method, W, H, m.config(**cfg), LayerOptions(scale_dtype=torch.float32))
