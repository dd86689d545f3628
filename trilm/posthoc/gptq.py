"""GPTQ (Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained Transformers").

Columns are quantized one at a time on the min/max grid; the rounding error of column i, divided by the
pivot of the upper Cholesky factor U of H⁻¹, is spread over the not-yet-quantized columns along row i of U,
which is the optimal (OBS) update for the layer-output error tr(ΔW H ΔWᵀ). Updates inside a block of
``blocksize`` columns are applied immediately; the rest of the matrix gets them once per block (one GEMM).

Behaviour matches the reference code (IST-DASLab/gptq), including its two quiet choices:

- per-row grids are fitted on the original W, before dead input columns are zeroed;
- *dynamic* groups (default) are fitted when the loop reaches a group's first column, on W as it stands at
  the start of the current block — it already carries the updates of earlier blocks but not those of the
  earlier columns of the same block. *Static* groups are fitted up front on the original W in original
  column order, so with act-order a group's columns are quantized out of order.

With act-order the columns are visited by descending diag(H) (a stable sort) and the result is put back in
the original order; with dynamic groups a group is then a set of columns scattered over K, which the packed
weight records as ``g_idx`` (column → group).
"""

from __future__ import annotations

import torch

from trilm.posthoc.hessian import inverse_cholesky_upper, prepare_hessian, proxy_loss
from trilm.posthoc.registry import LayerOptions, QuantResult, register_method
from trilm.posthoc.uniform import UniformConfig, fit_grid, pack_int, quantize_column


@register_method(
    "gptq",
    UniformConfig,
    "GPTQ: column-wise rounding with inverse-Hessian error feedback",
    paper_bits=UniformConfig.paper_bits,
    unwritable=UniformConfig.unpackable,
)
def gptq(W: torch.Tensor, H: torch.Tensor, cfg: UniformConfig, opts: LayerOptions) -> QuantResult:
    g = cfg.check_weight(W, opts.name)
    n, k = W.shape
    bits, sym, sd = cfg.bits, cfg.sym, opts.scale_dtype
    grouped = cfg.group_size > 0
    work = W.detach().to(H.device, torch.float32)
    scale, zero = fit_grid(work, bits, sym, sd)
    Hp, work, dead = prepare_hessian(H.to(work.device), work)

    groups_total = k // g
    scales = torch.empty((groups_total, n), device=work.device)
    zeros = torch.empty((groups_total, n), device=work.device)
    static: list[tuple[torch.Tensor, torch.Tensor]] = []
    if grouped and cfg.static_groups:
        static = [fit_grid(work[:, j : j + g], bits, sym, sd) for j in range(0, k, g)]
        for j, (s, z) in enumerate(static):
            scales[j], zeros[j] = s, z
    elif not grouped:
        scales[0], zeros[0] = scale, zero

    perm = None
    if cfg.act_order:
        perm = torch.argsort(torch.diag(Hp), descending=True, stable=True)
        work = work[:, perm]
        Hp = Hp[perm][:, perm]
    factor = inverse_cholesky_upper(Hp, cfg.percdamp, name=opts.name)
    hinv = factor.hinv
    del Hp

    codes = torch.empty((n, k), dtype=torch.uint8, device=work.device)
    Q = torch.empty((n, k), dtype=torch.float32, device=work.device)
    for i1 in range(0, k, cfg.blocksize):
        i2 = min(i1 + cfg.blocksize, k)
        block = work[:, i1:i2].clone()
        errors = torch.empty((n, i2 - i1), device=work.device)
        hinv_block = hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if grouped:
                if not cfg.static_groups:
                    if col % g == 0:
                        scale, zero = fit_grid(work[:, col : col + g], bits, sym, sd)
                        scales[col // g], zeros[col // g] = scale, zero
                else:
                    original = int(perm[col]) if perm is not None else col
                    scale, zero = static[original // g]
            w = block[:, i]
            c, q = quantize_column(w, scale, zero, bits)
            codes[:, col] = c
            Q[:, col] = q
            err = (w - q) / hinv_block[i, i]
            block[:, i:].addr_(err, hinv_block[i, i:], alpha=-1.0)
            errors[:, i] = err
        if i2 < k:
            work[:, i2:].addmm_(errors, hinv[i1:i2, i2:], alpha=-1.0)

    g_idx = None
    if perm is not None:
        inverse = torch.argsort(perm)
        Q, codes = Q[:, inverse], codes[:, inverse]
        if grouped and not cfg.static_groups:
            g_idx = (inverse // g).to(torch.int32)
    packed, why = pack_int(codes, scales, zeros, bits, g_idx, sd)
    return QuantResult(
        weight=Q.contiguous(),
        packed=packed,
        proxy_loss=proxy_loss(W.to(H.device), Q, H),
        method="gptq",
        config=cfg.to_dict(),
        damp=factor.damp,
        damp_retries=factor.retries,
        packed_error=why,
        extra={"dead_columns": int(dead.sum()), "perm": None if perm is None else perm.cpu()},
    )
