"""Whole-model methods as the CLI and the pipeline see them: every layer method plus the block methods.

A registered *layer* method (``register_method``: rtn, gptq, and the binary GPTQ-family methods) becomes a
model method automatically, driven by :class:`~trilm.posthoc.layerwise.LayerwiseMethod`. A *block* method
(OmniQuant: it trains through whole blocks) registers here with :func:`register_block_method`. Either way
the method's config dataclass is the single description of its settings: ``trilm quantize`` turns its fields
into options, the QuantLM records them, and validation errors name them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from trilm.config import Config, ConfigError
from trilm.posthoc.engine import BlockMethod


@dataclasses.dataclass(frozen=True)
class MethodOptions:
    """Driver-level settings every method may use."""

    true_sequential: bool = False
    scale_dtype: torch.dtype = torch.float16
    seed: int = 0
    calibration: Any = None
    """The job's CalibrationConfig (methods that train, PB-LLM's QAT, read their text from its source)."""
    tokenizer: Any = None
    """The model's tokenizer, for methods that read raw text."""


@dataclasses.dataclass(frozen=True)
class ModelMethod:
    name: str
    config_cls: type[Config]
    build: Callable[[Any, MethodOptions], BlockMethod]
    description: str
    paper_bits: Callable[[Any], float] | None = None
    unwritable: Callable[[Any], str | None] | None = None
    """Returns why a QuantLM with this config cannot be written faithfully (None: it can)."""

    def config(self, values: dict[str, Any]) -> Config:
        try:
            return self.config_cls.from_dict(dict(values))
        except ConfigError as exc:
            raise ConfigError(f"--method {self.name}: {exc}") from None


BLOCK_METHODS: dict[str, ModelMethod] = {}


def register_block_method(method: ModelMethod) -> ModelMethod:
    if method.name in BLOCK_METHODS:
        raise ValueError(f"block method {method.name!r} registered twice")
    BLOCK_METHODS[method.name] = method
    return method


def model_methods() -> dict[str, ModelMethod]:
    """Every method ``trilm quantize --method`` accepts, by name."""
    from trilm.posthoc.layerwise import LayerwiseMethod
    from trilm.posthoc.registry import METHODS

    out: dict[str, ModelMethod] = {}
    for name, layer in METHODS.items():

        def build(cfg, opts: MethodOptions, _name: str = name) -> BlockMethod:
            return LayerwiseMethod(
                _name, cfg, true_sequential=opts.true_sequential, scale_dtype=opts.scale_dtype
            )

        out[name] = ModelMethod(
            name, layer.config_cls, build, layer.description, layer.paper_bits, layer.unwritable
        )
    out.update(BLOCK_METHODS)
    return out


def get_model_method(name: str) -> ModelMethod:
    methods = model_methods()
    if name not in methods:
        raise ConfigError(f"unknown post-hoc method {name!r}; choose from {sorted(methods)}")
    return methods[name]
