"""Driving a per-layer method (GPTQ, RTN and the binary GPTQ-family methods) through the block-wise engine.

For each block: collect the Hessian of every input site (q/k/v share one, gate/up share one) with forward
hooks, quantize each linear with the registered layer method, and write the dequantized weight back, so the
block's recomputed outputs — the next block's inputs — are those of the quantized model. With
``true_sequential`` the linears are calibrated in four rounds, one per input site — [q, k, v] → [o] →
[gate, up] → [down] — each on inputs that already pass through the quantized linears before it (GPTQ's
``--true-sequential``; the order inside a round does not matter, its linears share one Hessian).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from trilm.config import Config
from trilm.dtypes import dtype_name
from trilm.formats import SCALE_DTYPE
from trilm.infer.model import block_linears
from trilm.model.spec import BY_NAME, LINEAR_NAMES, SITES, site_groups
from trilm.posthoc.engine import BlockContext, BlockMethod, LayerRecord, collect_inputs, site_modules
from trilm.posthoc.hessian import HessianAccumulator
from trilm.posthoc.registry import (
    LayerOptions,
    Method,
    MethodOptions,
    QuantResult,
    get_method,
    run_layer_method,
)


class LayerwiseMethod(BlockMethod):
    """A registered layer method applied to every block linear, Hessians from the calibration stream."""

    def __init__(
        self,
        method: str,
        cfg: Config,
        *,
        true_sequential: bool = False,
        scale_dtype: torch.dtype = SCALE_DTYPE,
    ):
        self.method = get_method(method)
        if not isinstance(cfg, self.method.config_cls):
            raise TypeError(f"{method}: expected a {self.method.config_cls.__name__}")
        self.name = method
        self.cfg = cfg
        self.true_sequential = true_sequential
        self.scale_dtype = scale_dtype
        self._stat_bytes = 0

    def describe(self) -> dict[str, Any]:
        return {
            **self.cfg.to_dict(),
            "true_sequential": self.true_sequential,
            "scale_dtype": dtype_name(self.scale_dtype),
        }

    def statistics_bytes(self) -> int:
        return self._stat_bytes

    @property
    def data_free(self) -> bool:
        return self.method.data_free

    def quantize_block(self, ctx: BlockContext) -> dict[str, LayerRecord]:
        linears = block_linears(ctx.block)
        rounds = site_groups() if self.true_sequential else (LINEAR_NAMES,)
        records: dict[str, LayerRecord] = {}
        self._stat_bytes = 0
        for names in rounds:
            present = [n for n in names if n in linears]
            if not present:
                continue
            if self.method.needs_hessian:
                hessians = self._hessians(ctx, present, linears)
            else:
                hessians = dict.fromkeys(SITES)
            for name in sorted(present, key=LINEAR_NAMES.index):
                module = linears[name]
                canonical = f"{ctx.prefix}{name}"
                opts = LayerOptions(scale_dtype=self.scale_dtype, name=canonical, need_packed=True)
                result = run_layer_method(
                    self.name,
                    module.weight.data,
                    hessians[BY_NAME[name].site],
                    self.layer_config(canonical),
                    opts,
                )
                self.layer_done(canonical, result)
                assert result.packed is not None  # need_packed: run_layer_method raised otherwise
                module.weight.data.copy_(result.weight.to(module.weight.dtype))
                proxy = None if math.isnan(result.proxy_loss) else result.proxy_loss
                records[canonical] = LayerRecord(
                    packed=result.packed.to("cpu"),
                    proxy_loss=proxy,
                    seconds=result.seconds,
                    extra={"damp": result.damp, "damp_retries": result.damp_retries},
                )
                ctx.report(f"{name} proxy {result.proxy_loss:.3g}" if proxy is not None else name)
            del hessians
        return records

    def layer_config(self, canonical: str) -> Config:
        """The config one linear is quantized with (subclasses vary it per layer, e.g. STBLLM's N)."""
        return self.cfg

    def layer_done(self, canonical: str, result: QuantResult) -> None:
        """Sees every layer's full result before the block moves on (subclasses keep what they need)."""

    def _hessians(self, ctx: BlockContext, names: list[str], linears: dict) -> dict[str, torch.Tensor]:
        """One Hessian per input site of ``names``, from one pass over the calibration stream."""
        sites = site_modules(linears, names)
        assert ctx.inputs is not None  # a method that needs a Hessian is not data-free
        accumulators = {
            site: HessianAccumulator(module.weight.shape[1], ctx.inputs.device)
            for site, module in sites.items()
        }
        collect_inputs(
            ctx.block,
            ctx.inputs,
            ctx.cos,
            ctx.sin,
            ctx.batch_size,
            sites,
            lambda site, x: accumulators[site].add_batch(x),
        )
        self._stat_bytes = max(self._stat_bytes, sum(a.H.numel() * 4 for a in accumulators.values()))
        return {site: acc.H for site, acc in accumulators.items()}


def block_method(method: Method, cfg: Config, opts: MethodOptions) -> BlockMethod:
    """The whole-model driver of a registered method: its own, or its layer function on every linear."""
    if method.driver is not None:
        return method.driver(cfg, opts)
    return LayerwiseMethod(
        method.name, cfg, true_sequential=opts.true_sequential, scale_dtype=opts.scale_dtype
    )
