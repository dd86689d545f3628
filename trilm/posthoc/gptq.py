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

With a llama.cpp ``target`` (``gguf-q4_0``/``gguf-q4_1``/``gguf-q8_0``) every group of 32 gets llama.cpp's
block grid with its fp16 numbers already rounded, and each column's error is the error on that grid, so the
feedback compensates exactly what the GGUF file will hold.
"""

from __future__ import annotations

import torch

from trilm.posthoc.hessian import inverse_cholesky_upper, prepare_hessian, proxy_loss
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
    "gptq",
    UniformConfig,
    "GPTQ: column-wise rounding with inverse-Hessian error feedback",
    paper_bits=UniformConfig.paper_bits,
    unwritable=UniformConfig.unpackable,
)
def gptq(W: torch.Tensor, H: torch.Tensor, cfg: UniformConfig, opts: LayerOptions) -> QuantResult:
    check_target_storage(cfg, opts.scale_dtype, opts.name)
    g = cfg.check_weight(W, opts.name)
    n, k = W.shape
    bits, sd = cfg.bits, opts.scale_dtype
    grouped = cfg.group_size > 0
    work = W.detach().to(H.device, torch.float32)
    grid = fit_target(work, cfg, sd)
    scale, zero, _ = grid
    Hp, work, dead = prepare_hessian(H.to(work.device), work)

    groups_total = k // g
    scales = torch.empty((groups_total, n), device=work.device)
    zeros = torch.empty((groups_total, n), device=work.device)
    mins = torch.empty((groups_total, n), device=work.device) if cfg.ggml == "q4_1" else None
    static: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
    if grouped and cfg.static_groups:
        static = [fit_target(work[:, j : j + g], cfg, sd) for j in range(0, k, g)]
        for j, (s, z, m) in enumerate(static):
            scales[j], zeros[j] = s, z
            if mins is not None and m is not None:
                mins[j] = m
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

    # Column-major working copies: column i of W is row i here, so every per-column read, write and
    # rank-1 update touches contiguous memory (on a row-major W they stride over N rows and run 10–50×
    # slower on CPU). The arithmetic is the reference's, element for element.
    work_t = work.t().contiguous()
    del work
    codes_t = torch.empty((k, n), dtype=torch.float32, device=work_t.device)
    q_t = torch.empty((k, n), dtype=torch.float32, device=work_t.device)
    maxq = (1 << bits) - 1
    for i1 in range(0, k, cfg.blocksize):
        i2 = min(i1 + cfg.blocksize, k)
        block = work_t[i1:i2].clone()
        errors = torch.empty((i2 - i1, n), device=block.device)
        hinv_block = hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if grouped:
                if not cfg.static_groups:
                    if col % g == 0:
                        grid = fit_target(work_t[col : col + g].t(), cfg, sd)
                        scale, zero, m = grid
                        scales[col // g], zeros[col // g] = scale, zero
                        if mins is not None and m is not None:
                            mins[col // g] = m
                else:
                    original = int(perm[col]) if perm is not None else col
                    grid = static[original // g]
                    scale, zero, _ = grid
            w, c, q = block[i], codes_t[col], q_t[col]
            if cfg.ggml is None:
                torch.div(w, scale, out=c).round_().add_(zero).clamp_(0, maxq)
                torch.mul(scale, c - zero, out=q)
            else:
                c.copy_(grid_codes(w, grid, cfg))
                q.copy_(grid_values(c, grid))
            torch.div(w - q, hinv_block[i, i], out=errors[i])
            block[i:].addr_(hinv_block[i, i:], errors[i], alpha=-1.0)
        if i2 < k:
            work_t[i2:].addmm_(hinv[i1:i2, i2:].t(), errors, alpha=-1.0)
    Q, codes = q_t.t(), codes_t.t().to(torch.uint8)

    g_idx = None
    if perm is not None:
        inverse = torch.argsort(perm)
        Q, codes = Q[:, inverse], codes[:, inverse]
        if grouped and not cfg.static_groups:
            g_idx = (inverse // g).to(torch.int32)
    packed, why = pack_int(codes, scales, zeros, bits, g_idx, sd, mins)
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
