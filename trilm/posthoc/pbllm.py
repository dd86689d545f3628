"""PB-LLM's post-training variant, PB-GPTQ ("PB-LLM: Partially Binarized Large Language Models").

1. H, dead columns, damping and the upper Cholesky factor U of H⁻¹ as GPTQ.
2. The salient mask is chosen once, over the whole matrix: score W²/U_jj² (``hessian``) or |W|
   (``magnitude``); the ``low_frac`` share with the lowest scores is binarized, the rest is salient.
3. Binarized weights: per row α·sign(w − μ) + μ; salient weights: ``high_bit``-bit asymmetric per-row grid
   fitted on the original rows (GPTQ's grid).
4. GPTQ's column loop: each column is quantized with its weight's rule and its error fed forward.

Statistics of the binary part (μ = mean, α = mean |w − μ| per row):

- *corrected* (default): over the binarized weights of the row only;
- *reference* (``reference_mode``): over the whole row with the salient positions counted as zeros
  (``mean(W·mask)``), as the reference code computes them. Salient zeros pull μ toward 0 and add |μ| terms
  to α, so α comes out ≈ 10 % low for a 10 % salient share and the binary error grows (measured in
  docs/posthoc.md). Reference mode also uses the reference's threshold rule (binarize every score ≤ the
  ⌊low_frac·numel⌋-th smallest, ties included; the corrected rule binarizes exactly round(low_frac·numel)).

With ``low_frac = 0`` (nothing binarized) this is exactly ``high_bit``-bit per-row asymmetric GPTQ. The output
is a :class:`~trilm.formats.PartialBinaryWeight`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch

from trilm.config import Config, require
from trilm.formats import PartialBinaryWeight, layer_bits, pbllm_bits
from trilm.posthoc.hessian import inverse_cholesky_upper, prepare_hessian, proxy_loss
from trilm.posthoc.registry import LayerOptions, QuantResult, register_method
from trilm.posthoc.uniform import fit_grid, quantize_column, stored


@dataclasses.dataclass
class PBLLMConfig(Config):
    """PB-LLM's settings: reference defaults except the saliency (its README uses hessian)."""

    low_frac: float = 0.9
    """Share of the weights that is binarized (0.9 = 10 % salient)."""
    salient_metric: Literal["hessian", "magnitude"] = "hessian"
    high_bit: int = 8
    """Bits of the salient weights' per-row grid."""
    blocksize: int = 128
    percdamp: float = 0.01
    reference_mode: bool = False
    """Binary statistics over all weights with salient ones as zeros, and the reference's threshold rule."""
    qat_steps: int = 0
    """Whole-model runs: train the binary part this many steps with STE after PTQ (PB-LLM's QAT)."""
    qat_lr: float = 1e-4
    qat_batch: int = 8
    """QAT sequences per step (of the calibration length)."""
    qat_data: str = ""
    """QAT training text: a prepared split, folder or file ("" = the calibration source)."""

    def validate(self) -> None:
        require(0.0 <= self.low_frac <= 1.0, f"low_frac: must be in [0, 1], got {self.low_frac}")
        require(2 <= self.high_bit <= 8, f"high_bit: must be in 2..8 (stored codes), got {self.high_bit}")
        require(self.blocksize > 0, f"blocksize: must be > 0, got {self.blocksize}")
        require(self.percdamp >= 0, f"percdamp: must be >= 0, got {self.percdamp}")
        require(self.qat_steps >= 0, f"qat_steps: must be >= 0, got {self.qat_steps}")
        require(self.qat_lr > 0, f"qat_lr: must be > 0, got {self.qat_lr}")
        require(self.qat_batch > 0, f"qat_batch: must be > 0, got {self.qat_batch}")

    def paper_bits(self) -> float:
        """PB-LLM's bound at this salient share: (1 − r)·1 + r·high_bit + 1 (bitmap)."""
        return pbllm_bits(1.0 - self.low_frac, self.high_bit)


def binarized_mask(score: torch.Tensor, low_frac: float, reference: bool) -> torch.Tensor:
    """bool: the weights PB-LLM binarizes — the low_frac share of the lowest scores, over the whole matrix."""
    flat = score.reshape(-1)
    if reference:
        index = min(int(flat.numel() * low_frac), flat.numel() - 1)
        return score <= torch.sort(flat).values[index]
    count = round(flat.numel() * low_frac)
    mask = torch.zeros(flat.numel(), dtype=torch.bool, device=score.device)
    if count:
        mask[torch.argsort(flat, stable=True)[:count]] = True
    return mask.reshape(score.shape)


def binary_statistics(
    w: torch.Tensor, binarized: torch.Tensor, reference: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (α, μ) of the binary part: corrected over binarized weights only, reference over whole rows
    with the salient weights as zeros."""
    m = binarized.to(w.dtype)
    if reference:
        masked = w * m
        mu = masked.mean(1)
        return (masked - mu.unsqueeze(1)).abs().mean(1), mu
    count = m.sum(1)
    safe = count.clamp(min=1)
    mu = (w * m).sum(1) / safe
    alpha = ((w - mu.unsqueeze(1)).abs() * m).sum(1) / safe
    return alpha, mu


@register_method(
    "pbllm",
    PBLLMConfig,
    "PB-LLM (PB-GPTQ): salient weights on a high-bit grid, the rest binarized, GPTQ error feedback",
    paper_bits=PBLLMConfig.paper_bits,
)
def pbllm(W: torch.Tensor, H: torch.Tensor, cfg: PBLLMConfig, opts: LayerOptions) -> QuantResult:
    n, k = W.shape
    sd = opts.scale_dtype
    work = W.detach().to(H.device, torch.float32)
    scale8, zero8 = fit_grid(work, cfg.high_bit, False, sd)
    Hp, work, dead = prepare_hessian(H.to(work.device), work)
    factor = inverse_cholesky_upper(Hp, cfg.percdamp, name=opts.name)
    hinv = factor.hinv
    del Hp
    if cfg.salient_metric == "hessian":
        score = work**2 / torch.diag(hinv).unsqueeze(0) ** 2
    else:
        score = work.abs()
    binarized = binarized_mask(score, cfg.low_frac, cfg.reference_mode)
    alpha, mu = binary_statistics(work, binarized, cfg.reference_mode)
    alpha, mu = stored(alpha, sd), stored(mu, sd)

    codes = torch.zeros((n, k), dtype=torch.uint8, device=work.device)
    signs = torch.ones((n, k), dtype=torch.int8, device=work.device)
    Q = torch.empty((n, k), dtype=torch.float32, device=work.device)
    latent = torch.empty((n, k), dtype=torch.float32, device=work.device) if cfg.qat_steps else None
    for i1 in range(0, k, cfg.blocksize):
        i2 = min(i1 + cfg.blocksize, k)
        block = work[:, i1:i2].clone()
        errors = torch.empty((n, i2 - i1), device=work.device)
        hinv_block = hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            w = block[:, i]
            if latent is not None:
                latent[:, col] = w
            c, q_high = quantize_column(w, scale8, zero8, cfg.high_bit)
            sign = torch.where(w - mu >= 0, 1, -1).to(torch.int8)
            q_low = alpha * sign + mu
            low = binarized[:, col]
            q = torch.where(low, q_low, q_high)
            codes[:, col] = c
            signs[:, col] = sign
            Q[:, col] = q
            err = (w - q) / hinv_block[i, i]
            block[:, i:].addr_(err, hinv_block[i, i:], alpha=-1.0)
            errors[:, i] = err
        if i2 < k:
            work[:, i2:].addmm_(errors, hinv[i1:i2, i2:], alpha=-1.0)

    packed = PartialBinaryWeight.pack(
        ~binarized,
        signs,
        codes.to(torch.int64),
        alpha.to(sd),
        mu.to(sd),
        scale8.to(sd),
        zero8,
        cfg.high_bit,
    )
    return QuantResult(
        weight=Q,
        packed=packed,
        proxy_loss=proxy_loss(W.to(H.device), Q, H),
        method="pbllm",
        config=cfg.to_dict(),
        damp=factor.damp,
        damp_retries=factor.retries,
        extra={
            "dead_columns": int(dead.sum()),
            "salient_share": float((~binarized).float().mean()),
            "bits": layer_bits(packed),
            **({"latent": latent} if latent is not None else {}),
        },
    )
