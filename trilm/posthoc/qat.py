"""PB-LLM's quantization-aware training: the binary part trained with a straight-through estimator, the
salient weights frozen at their high-bit values.

Starting point: the PB-GPTQ result. Each linear becomes a :class:`PartialBinaryLinear` whose weight is

    W = salient ? (frozen high-bit value) : α_r · sign(L − μ_r) + μ_r

with latent weights L (initialized to the values PB-GPTQ binarized, i.e. after its error feedback, so step 0
computes exactly the PTQ model) and per-row α, μ (initialized to PB-GPTQ's) as the trainable parameters;
the backward of sign is the identity (STE), as in trilm's BiLM training. Nothing else trains (embeddings,
norms and head stay as they are).

The loop steps through trilm's one schedule (:class:`trilm.schedule.Schedule`: warmup, cosine decay) with
AdamW and gradient clipping, on the plain-PyTorch inference model: the binary
part of a QuantLM is not a megatron model, so the DeepSpeed trainer has nothing to train here. Batches are
``batch`` windows of seq_len + 1 tokens drawn from the training text with a seed per step.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from trilm.data.text_source import sample_windows
from trilm.formats import PartialBinaryWeight
from trilm.schedule import Schedule, ScheduleConfig


class _SignSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u):
        return torch.where(u >= 0, 1.0, -1.0).to(u.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad


class PartialBinaryLinear(nn.Module):
    """A PB-LLM linear for training: frozen salient values, latent binary weights and per-row α, μ."""

    def __init__(self, packed: PartialBinaryWeight, latent: torch.Tensor):
        super().__init__()
        mask, _, codes = packed.planes()
        values = (codes.float() - packed.zero.float().unsqueeze(1)) * packed.scale.float().unsqueeze(1)
        self.register_buffer("salient", mask)
        self.register_buffer("salient_values", torch.where(mask, values, torch.zeros_like(values)))
        self.latent = nn.Parameter(latent.detach().float().clone())
        self.alpha = nn.Parameter(packed.alpha.detach().float().clone())
        self.mu = nn.Parameter(packed.mu.detach().float().clone())
        self.high_bits = packed.high_bits
        self.codes = codes
        self.scale, self.zero = packed.scale, packed.zero
        self.in_features, self.out_features = packed.in_features, packed.out_features

    def weight_now(self) -> torch.Tensor:
        mu = self.mu.unsqueeze(1)
        binary = self.alpha.unsqueeze(1) * _SignSTE.apply(self.latent - mu) + mu
        return torch.where(self.salient, self.salient_values, binary)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight_now().to(x.dtype))

    @torch.no_grad()
    def pack(self, dtype: torch.dtype) -> PartialBinaryWeight:
        """The trained layer in the storage format (α, μ rounded to ``dtype``; signs from the latents)."""
        alpha, mu = self.alpha.to(dtype), self.mu.to(dtype)
        signs = torch.where(self.latent - mu.float().unsqueeze(1) >= 0, 1, -1).to(torch.int8)
        return PartialBinaryWeight.pack(
            self.salient, signs, self.codes, alpha, mu, self.scale, self.zero, self.high_bits
        )


@dataclasses.dataclass
class QATSettings:
    steps: int
    lr: float
    batch: int
    seq_len: int
    seed: int = 0
    warmup: float = 0.05
    grad_clip: float = 1.0
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW's betas: pretraining's defaults (:class:`trilm.train.config.OptimConfig`)."""


def train_binary_part(
    model: nn.Module,
    layers: dict[str, PartialBinaryWeight],
    latents: dict[str, torch.Tensor],
    tokens: torch.Tensor,
    settings: QATSettings,
    *,
    device: str | torch.device = "cpu",
    progress: bool = True,
) -> tuple[dict[str, PartialBinaryWeight], list[float]]:
    """Train the binary part of every PB-LLM layer of ``model`` (an InferenceModel holding the PTQ weights;
    ``layers``/``latents`` by canonical name without ``.weight``) for ``settings.steps`` steps on windows of
    ``tokens``. Returns the retrained packed layers and the loss per step; the model's linears hold the
    retrained (dequantized) weights afterwards."""

    device = torch.device(device)
    originals = {name: model.linear_modules()[f"{name}.weight"] for name in layers}
    trainers = {name: PartialBinaryLinear(layers[name], latents[name]).to(device) for name in layers}
    dtypes = {name: layers[name].alpha.dtype for name in layers}
    model.requires_grad_(False)
    for name, module in trainers.items():
        model.set_linear(f"{name}.weight", module)
    model.to(device)
    params = [p for m in trainers.values() for p in m.parameters()]
    schedule = Schedule(
        ScheduleConfig(warmup=settings.warmup, decay="cosine"), settings.steps, peak_lr=settings.lr
    )
    optimizer = torch.optim.AdamW(params, lr=settings.lr, betas=settings.betas, weight_decay=0.0)
    losses: list[float] = []
    bar = tqdm(range(settings.steps), desc="pbllm qat", unit="step", disable=not progress)
    try:
        model.train()
        for step in bar:
            for group in optimizer.param_groups:
                group["lr"] = schedule.lr(step)
            batch = sample_windows(
                tokens, settings.batch, settings.seq_len + 1, settings.seed * 1_000_003 + step
            )
            batch = batch.to(device)
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
            if not math.isfinite(float(loss.detach())):
                raise FloatingPointError(f"pbllm qat: loss is {float(loss.detach())} at step {step}")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
            optimizer.step()
            losses.append(float(loss.detach()))
            bar.set_postfix_str(f"loss {losses[-1]:.4f}")
    finally:
        bar.close()
        model.eval()
    packed = {}
    for name, trainer in trainers.items():
        packed[name] = trainer.pack(dtypes[name]).to("cpu")
        original = originals[name]
        with torch.no_grad():
            original.weight.copy_(packed[name].dequantize().to(original.weight.dtype))
        model.set_linear(f"{name}.weight", original)
    model.to("cpu")
    return packed, losses
