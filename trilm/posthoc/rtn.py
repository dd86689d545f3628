"""Round-to-nearest on the GPTQ grid: the baseline every error-compensating method is measured against.

Each group of ``group_size`` consecutive input columns of a row gets its own min/max grid (fitted with
:func:`trilm.formats.fit_uniform_grid`) and every weight is rounded to its nearest level independently; H
is used only for the proxy loss. With fp32 scales this is exactly :func:`trilm.formats.quantize_uniform`;
with a llama.cpp ``target`` it is llama.cpp's own rounding, fitted to the fp16 block numbers.
"""

from __future__ import annotations

import torch

from trilm.config import ConfigError
from trilm.posthoc.hessian import proxy_loss
from trilm.posthoc.registry import LayerOptions, QuantResult, register_method
from trilm.posthoc.uniform import (
    UniformConfig,
    check_target_storage,
    fit_target,
    grid_codes,
    grid_values,
    pack_int,
)


@register_method(
    "rtn",
    UniformConfig,
    "round-to-nearest on the min/max grid (no error compensation)",
    paper_bits=UniformConfig.paper_bits,
    unwritable=UniformConfig.unpackable,
    needs_hessian=False,
)
def rtn(W: torch.Tensor, H: torch.Tensor | None, cfg: UniformConfig, opts: LayerOptions) -> QuantResult:
    if cfg.act_order or cfg.static_groups:
        raise ConfigError(
            f"{opts.name}: rtn rounds every weight independently; act_order/static_groups are GPTQ settings"
        )
    check_target_storage(cfg, opts.scale_dtype, opts.name)
    g = cfg.check_weight(W, opts.name)
    n, k = W.shape
    blocks = W.float().reshape(n, k // g, g).transpose(0, 1).reshape(-1, g)
    grid = fit_target(blocks, cfg, opts.scale_dtype)
    codes = grid_codes(blocks, grid, cfg)
    deq = grid_values(codes, grid)
    weight = deq.reshape(k // g, n, g).transpose(0, 1).reshape(n, k).contiguous()
    codes = codes.reshape(k // g, n, g).transpose(0, 1).reshape(n, k)
    scale, zero, mins = grid
    packed, why = pack_int(
        codes,
        scale.reshape(k // g, n),
        zero.reshape(k // g, n),
        cfg.bits,
        None,
        opts.scale_dtype,
        None if mins is None else mins.reshape(k // g, n),
    )
    return QuantResult(
        weight=weight,
        packed=packed,
        proxy_loss=float("nan") if H is None else proxy_loss(W, weight, H),
        method="rtn",
        config=cfg.to_dict(),
        packed_error=why,
    )
