"""BiLLM ("BiLLM: Pushing the Limit of Post-Training Quantization for LLMs") and STBLLM ("STBLLM: Breaking the
1-Bit Barrier with Structured Binary LLMs") as layer methods over the GPTQ machinery.

Per block of ``blocksize`` input columns, on the weights as the earlier blocks' error feedback left them:

1. (STBLLM) N:M keep mask: in every ``m`` consecutive inputs of a row keep the ``n`` with the largest
   standardized importance (:func:`~trilm.posthoc.binarize.standardized_importance`, activation norms from
   diag H) or magnitude;
2. salient columns (top columns by Σ|S|, count searched) binarized at order 2 (two sign planes);
3. the other kept weights split by |S| — BiLLM: two groups at a searched break point, STBLLM: three
   (trisection, p₂ = ``ratio``·p₁) — each binarized at order 1;
4. the block's approximation is computed once from the block's weights (no compensation inside the block,
   as in both papers); its error, divided by the pivots of the upper Cholesky factor of H⁻¹, updates the
   columns after the block.

Pruned weights are exactly 0 in the output and in the packed weight: they enter no statistic, and their
(updated) value counts as error for the later blocks. ``reference_mode`` switches BiLLM's documented quirks
back on (signed magnitude score; searches on S instead of W; split quantiles over the whole block including
the salient columns' zeros), see :mod:`trilm.posthoc.binarize`. The output is a
:class:`~trilm.formats.ResidualBinaryWeight`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch

from trilm.config import Config, ConfigError, require
from trilm.formats import ResidualBinaryWeight, billm_bits, layer_bits, stbllm_bits
from trilm.formats.residual import param_count
from trilm.posthoc.binarize import (
    SALIENT_ORDER,
    nm_keep,
    residual_fit,
    search_salient_columns,
    search_space,
    search_split,
    standardized_importance,
)
from trilm.posthoc.hessian import inverse_cholesky_upper, prepare_hessian, proxy_loss
from trilm.posthoc.registry import LayerOptions, QuantResult, register_method
from trilm.posthoc.uniform import stored


@dataclasses.dataclass
class BiLLMConfig(Config):
    """BiLLM's settings; defaults are the reference code's except the saliency (its commands use hessian)."""

    salient_metric: Literal["hessian", "magnitude"] = "hessian"
    blocksize: int = 128
    """Columns per block: salient columns, split and parameters are per block (and per row)."""
    percdamp: float = 0.01
    reference_mode: bool = False
    """Reproduce the reference code's quirks (signed magnitude score, search on S, quantiles with zeros)."""
    max_salient_columns: int = 50
    """Salient columns tried per block: 1 … max − 1 (the reference's up_lim)."""

    def validate(self) -> None:
        require(self.blocksize > 0, f"blocksize: must be > 0, got {self.blocksize}")
        require(self.percdamp >= 0, f"percdamp: must be >= 0, got {self.percdamp}")
        require(self.max_salient_columns >= 1, "max_salient_columns: must be >= 1")

    def paper_bits(self) -> float:
        """BiLLM's count at its typical 10 % salient share (the QuantLM records the measured share)."""
        return billm_bits(0.1)


@dataclasses.dataclass
class STBLLMConfig(BiLLMConfig):
    """STBLLM: N:M (N kept of every M consecutive inputs) on top of BiLLM, with a trisection split."""

    n: int = 4
    m: int = 8
    prune_metric: Literal["si", "magnitude"] = "si"
    """N:M ranking: standardized importance (STBLLM) or |W| (the BiLLM + magnitude N:M baseline)."""
    groups: int = 3
    """Split of the non-salient weights: 3 = trisection (STBLLM), 2 = BiLLM's break point."""
    ratio: float = 2.0
    """Trisection: p₂ = ratio · p₁."""
    adaptive_n: bool = True
    """Whole-model runs: per-layer N from the layers' outlier ratios, mean kept share unchanged."""
    adaptive_unit: Literal["block", "linear"] = "block"
    """What gets its own N: a decoder layer (OWL, STBLLM) or every linear."""

    def validate(self) -> None:
        super().validate()
        require(
            0 < self.n <= self.m <= 16, f"n, m: need 0 < n ≤ m ≤ 16 (n = kept per m), got {self.n}:{self.m}"
        )
        require(self.blocksize % self.m == 0, f"blocksize: {self.blocksize} is not a multiple of m={self.m}")
        require(self.groups in (1, 2, 3), f"groups: must be 1, 2 or 3, got {self.groups}")
        require(self.ratio > 1, f"ratio: must be > 1, got {self.ratio}")

    def paper_bits(self) -> float:
        return stbllm_bits(0.1, self.n, self.m)

    def check_in_features(self, k: int, name: str = "layer") -> None:
        """N:M groups tile the input dimension: refuse a K that M does not divide (before any work)."""
        if k % self.m:
            raise ConfigError(f"{name}: in_features={k} is not a multiple of m={self.m}")


def residual_gptq(
    W: torch.Tensor,
    H: torch.Tensor,
    cfg: BiLLMConfig,
    opts: LayerOptions,
    *,
    groups: int = 2,
    ratio: float = 2.0,
    nm: tuple[int, int] | None = None,
    prune_metric: str = "magnitude",
) -> tuple[torch.Tensor, ResidualBinaryWeight, dict]:
    """The BiLLM/STBLLM block loop: (dequantized weight, packed weight, details)."""
    n_rows, k = W.shape
    b = cfg.blocksize
    if nm is not None and k % nm[1]:
        raise ConfigError(f"{opts.name}: in_features={k} is not a multiple of m={nm[1]}")
    act_norm = torch.diag(H).float().clamp(min=0).sqrt()
    Hp, work, dead = prepare_hessian(H, W)
    factor = inverse_cholesky_upper(Hp, cfg.percdamp, name=opts.name)
    hinv = factor.hinv
    del Hp
    dev, sd = work.device, opts.scale_dtype
    n_blocks = -(-k // b)
    Q = torch.zeros((n_rows, k), device=dev)
    kept_all = torch.ones((n_rows, k), dtype=torch.bool, device=dev)
    salient_all = torch.zeros(k, dtype=torch.bool, device=dev)
    gid_all = torch.zeros((n_rows, k), dtype=torch.int64, device=dev)
    signs_all = torch.ones((SALIENT_ORDER, n_rows, k), dtype=torch.int8, device=dev)
    params = torch.zeros((n_blocks, param_count(SALIENT_ORDER, groups), n_rows), device=dev)
    for blk, i1 in enumerate(range(0, k, b)):
        i2 = min(i1 + b, k)
        wb = work[:, i1:i2].clone()
        d = torch.diag(hinv)[i1:i2]
        if nm is None:
            kept = torch.ones_like(wb, dtype=torch.bool)
        else:
            metric = wb.abs() if prune_metric == "magnitude" else standardized_importance(wb, act_norm[i1:i2])
            kept = nm_keep(metric, *nm)
        space = search_space(wb, d, kept, cfg.salient_metric, cfg.reference_mode)
        salient = search_salient_columns(space, cfg.max_salient_columns)
        gid = search_split(space, salient, groups, ratio)
        sal_mask = kept & salient.unsqueeze(0)
        fit = residual_fit(wb, sal_mask, SALIENT_ORDER)
        mu_s = stored(fit.mu.sum(0), sd)
        alpha_s = stored(fit.alpha, sd)
        qb = mu_s.unsqueeze(1).expand_as(wb)
        for p in range(SALIENT_ORDER):  # the order ResidualBinaryWeight.dequantize adds them in
            qb = qb + alpha_s[p].unsqueeze(1) * fit.signs[p]
        qb = torch.where(sal_mask, qb, torch.zeros_like(qb))
        params[blk, 0] = mu_s
        params[blk, 1 : 1 + SALIENT_ORDER] = alpha_s
        first_sign = torch.where(sal_mask, fit.signs[0], 1)
        for g in range(groups):
            member = gid == g
            gfit = residual_fit(wb, member, 1)
            mu_g, alpha_g = stored(gfit.mu[0], sd), stored(gfit.alpha[0], sd)
            params[blk, 1 + SALIENT_ORDER + 2 * g] = mu_g
            params[blk, 2 + SALIENT_ORDER + 2 * g] = alpha_g
            value = mu_g.unsqueeze(1) + alpha_g.unsqueeze(1) * gfit.signs[0]
            qb = torch.where(member, value, qb)
            first_sign = torch.where(member, gfit.signs[0], first_sign)
        Q[:, i1:i2] = qb
        kept_all[:, i1:i2] = kept
        salient_all[i1:i2] = salient
        gid_all[:, i1:i2] = gid.clamp(min=0)
        signs_all[0, :, i1:i2] = first_sign
        signs_all[1, :, i1:i2] = torch.where(sal_mask, fit.signs[1], 1)
        if i2 < k:
            err = (wb - qb) / d.unsqueeze(0)
            work[:, i2:].addmm_(err, hinv[i1:i2, i2:], alpha=-1.0)
    packed = ResidualBinaryWeight.pack(
        salient_cols=salient_all,
        signs=signs_all,
        group_ids=gid_all,
        params=params.to(sd),
        kept=None if nm is None else kept_all,
        block_size=b,
        groups=groups,
        nm_n=nm[0] if nm else 1,
        nm_m=nm[1] if nm else 1,
    )
    details = {
        "damp": factor.damp,
        "damp_retries": factor.retries,
        "dead_columns": int(dead.sum()),
        "salient_column_share": float(salient_all.float().mean()),
        "kept_share": float(kept_all.float().mean()),
    }
    return Q, packed, details


def _result(name, W, H, cfg, Q, packed, details) -> QuantResult:
    bits = layer_bits(packed)
    return QuantResult(
        weight=Q.contiguous(),
        packed=packed,
        proxy_loss=proxy_loss(W.to(H.device), Q, H),
        method=name,
        config=cfg.to_dict(),
        damp=details.pop("damp"),
        damp_retries=details.pop("damp_retries"),
        extra={**details, "bits": bits},
    )


@register_method(
    "billm",
    BiLLMConfig,
    "BiLLM: Hessian-salient columns at residual order 2, bell-shaped split of the rest, block compensation",
    paper_bits=BiLLMConfig.paper_bits,
)
def billm(W: torch.Tensor, H: torch.Tensor, cfg: BiLLMConfig, opts: LayerOptions) -> QuantResult:
    Q, packed, details = residual_gptq(W, H, cfg, opts, groups=2)
    return _result("billm", W, H, cfg, Q, packed, details)


@register_method(
    "stbllm",
    STBLLMConfig,
    "STBLLM: N:M pruning (standardized importance) + BiLLM binarization with a trisection split",
    paper_bits=STBLLMConfig.paper_bits,
)
def stbllm(W: torch.Tensor, H: torch.Tensor, cfg: STBLLMConfig, opts: LayerOptions) -> QuantResult:
    nm = None if cfg.n == cfg.m else (cfg.n, cfg.m)
    Q, packed, details = residual_gptq(
        W, H, cfg, opts, groups=cfg.groups, ratio=cfg.ratio, nm=nm, prune_metric=cfg.prune_metric
    )
    return _result("stbllm", W, H, cfg, Q, packed, details)
