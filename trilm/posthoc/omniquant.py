"""OmniQuant (Shao et al., "OmniQuant: Omnidirectionally Calibrated Quantization for Large Language Models").

Block by block, the *quantization parameters* are trained while the weights stay frozen: the loss is the
MSE between the float block's outputs (on the float model's inputs) and the quantized block's outputs (on
the quantized model's inputs), minimized with AdamW.

- **LWC** (learnable weight clipping), one pair of logits (γ, β) per output row or row-group, initialized to
  4.0 (σ = 0.982): x_max = σ(γ)·max W, x_min = σ(β)·min W, s = clamp((x_max − x_min)/(2^b − 1), 1e-5, 1e4),
  z = round(−x_min / s) (no gradient through z), Ŵ = s·(clamp(⌊W/s⌉ + z, 0, 2^b − 1) − z) with a
  straight-through round. Differences from the reference: the clipped range always contains 0 (it does
  for any group with weights of both signs; a one-signed group would otherwise need a zero point outside
  the stored uint8 range), and scales are rounded to the stored precision (fp16) before the final codes
  are taken, so the packed weight is exactly the model that is evaluated.
- **LET** (:mod:`trilm.posthoc.let`) only in weight-activation modes; LLaMA weight-only uses LWC alone
  (the maintainers' setting).
- After training, LET is folded into the norm gains and weights, the learned clipping becomes the packed
  grid's scales and zeros (an ``IntWeight``: no extra tensors at run time), and the block's outputs are
  recomputed with those weights for the next block.

Modes: ``W4A16`` (per row), ``W3A16g128``, ``W2A16g128``, ``W4A4``. Defaults follow the reference's
scripts: 20 epochs (W2: 40 with the auxiliary loss on the quantized stream), lwc_lr 1e-2, let_lr 5e-3
(W4A4: 1e-3, α 0.75), weight decay 0, one sequence per step. Training runs in fp32 (no AMP: the reference's
fp16 autocast is a CUDA speed choice and a known NaN source).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trilm.config import Config, ConfigError, require
from trilm.dtypes import dtype_name
from trilm.formats import SCALE_DTYPE, gptq_bits
from trilm.infer.model import block_forward, block_linears, block_weights
from trilm.posthoc.blockfn import activation_quantizer, round_ste
from trilm.posthoc.engine import (
    BlockContext,
    BlockMethod,
    LayerRecord,
    collect_inputs,
    run_block,
    site_modules,
)
from trilm.posthoc.let import LETScales
from trilm.posthoc.registry import register_block_method
from trilm.posthoc.uniform import GROUP_FITS, group_width, pack_int

LWC_INIT = 4.0
MODES: dict[str, dict[str, Any]] = {
    "W4A16": dict(bits=4, group_size=-1, act_bits=16),
    "W3A16g128": dict(bits=3, group_size=128, act_bits=16),
    "W2A16g128": dict(bits=2, group_size=128, act_bits=16, epochs=40, aug_loss=True),
    "W4A4": dict(bits=4, group_size=-1, act_bits=4, let_lr=1e-3, alpha=0.75),
}
_MODE_RE = re.compile(r"^W(\d+)A(\d+)(?:g(\d+))?$")


@dataclasses.dataclass
class OmniQuantConfig(Config):
    """OmniQuant's settings; :func:`mode_config` gives the reference's per-mode values."""

    bits: int = 4
    group_size: int = -1
    act_bits: int = 16
    """16 = weight-only; 4 (or 6, 8) = per-token dynamic activation quantization with LET."""
    epochs: int = 20
    lwc_lr: float = 1e-2
    let_lr: float = 5e-3
    alpha: float = 0.5
    """SmoothQuant migration strength of the LET initialization."""
    wd: float = 0.0
    batch_size: int = 1
    """Calibration sequences per optimizer step."""
    aug_loss: bool = False
    """Add the MSE against the float block applied to the quantized stream (the reference's W2 setting)."""
    loss_skip_first: int = 0
    """Positions at the start of every calibration window left out of the block loss (0: the paper's loss,
    every position). Not in the paper: an option to test a cause. A model with massive activations at a
    window's first position (SmolLM2-135M: |h| ≈ 25,000 from block 11 on) makes the mean squared error
    almost all that position's inherited error, which no clipping of the block can reduce."""
    let: bool | None = None
    """None: on exactly when activations are quantized."""
    group_fit: str = "exact"
    """``exact`` or ``nearest``: as :attr:`trilm.posthoc.uniform.UniformConfig.group_fit`."""

    def validate(self) -> None:
        require(self.group_fit in GROUP_FITS, f"group_fit: one of {list(GROUP_FITS)}, got {self.group_fit!r}")
        require(self.bits in (2, 3, 4), f"bits: OmniQuant packs 2, 3 or 4 bits here, got {self.bits}")
        require(
            self.group_size == -1 or self.group_size > 0,
            f"group_size: must be -1 (per row) or > 0, got {self.group_size}",
        )
        require(self.act_bits in (4, 6, 8, 16), f"act_bits: one of 4, 6, 8, 16, got {self.act_bits}")
        require(self.epochs >= 0, f"epochs: must be >= 0, got {self.epochs}")
        require(self.lwc_lr > 0 and self.let_lr > 0, "lwc_lr/let_lr: must be > 0")
        require(0 <= self.alpha <= 1, f"alpha: must be in [0, 1], got {self.alpha}")
        require(self.wd >= 0, f"wd: must be >= 0, got {self.wd}")
        require(self.batch_size > 0, f"batch_size: must be > 0, got {self.batch_size}")
        require(self.loss_skip_first >= 0, f"loss_skip_first: must be >= 0, got {self.loss_skip_first}")

    def check_in_features(self, k: int, name: str = "layer") -> int:
        return group_width(k, self.group_size, name, self.group_fit)

    @property
    def use_let(self) -> bool:
        return self.act_bits < 16 if self.let is None else self.let

    @property
    def mode(self) -> str:
        group = f"g{self.group_size}" if self.group_size > 0 else ""
        return f"W{self.bits}A{self.act_bits}{group}"


def mode_config(mode: str, **overrides: Any) -> OmniQuantConfig:
    """``mode_config("W3A16g128")``: the reference's settings for a mode (others: parsed, defaults)."""
    if mode in MODES:
        values = dict(MODES[mode])
    else:
        m = _MODE_RE.match(mode)
        if not m:
            raise ConfigError(f"mode: {mode!r} is not of the form W<bits>A<bits>[g<group>], e.g. W3A16g128")
        values = dict(bits=int(m.group(1)), act_bits=int(m.group(2)), group_size=int(m.group(3) or -1))
    values.update(overrides)
    return OmniQuantConfig.from_dict(values)


class _GridQuant(torch.autograd.Function):
    """s·(clamp(⌊x/s⌉ + z, 0, maxq) − z) with a straight-through round, forward and backward fused.

    Autograd over the elementwise chain costs about a dozen full-size tensors per matrix and step; the
    gradients in closed form need three: ∂/∂x = 1 inside the clamp range, 0 outside; ∂/∂s = ⌊x/s⌉ − x/s
    inside, (clamped code − z) outside (the same values the unfused chain's autograd produces)."""

    @staticmethod
    def forward(ctx, x, scale, zero, maxq: int):
        u = x / scale
        r = torch.round(u)
        code = r + zero
        inside = (code >= 0) & (code <= maxq)
        q = torch.clamp(code, 0, maxq) - zero
        ctx.save_for_backward(inside, torch.where(inside, r - u, q))
        return q * scale

    @staticmethod
    def backward(ctx, grad):
        inside, ds = ctx.saved_tensors
        grad_x = grad * inside if ctx.needs_input_grad[0] else None
        grad_s = (grad * ds).sum(-1, keepdim=True) if ctx.needs_input_grad[1] else None
        return grad_x, grad_s, None, None


class LWC(nn.Module):
    """Learnable clipping of one weight matrix on the asymmetric min/max grid (per row or row-group)."""

    def __init__(
        self, weight: torch.Tensor, bits: int, group_size: int, name: str = "layer", fit: str = "exact"
    ):
        super().__init__()
        n, k = weight.shape
        g = group_width(k, group_size, name, fit)
        self.bits, self.group = bits, g
        rows = n * (k // g)
        self.upbound = nn.Parameter(torch.full((rows, 1), LWC_INIT, device=weight.device))
        self.lowbound = nn.Parameter(torch.full((rows, 1), LWC_INIT, device=weight.device))
        self._source = weight
        x = weight.detach().reshape(-1, g)
        self._range = (x.amax(-1, keepdim=True), x.amin(-1, keepdim=True))

    def grid(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(groups (rows, g), scale (rows, 1), zero (rows, 1)) of the clipped grid (scale has gradients)."""
        x = weight.reshape(-1, self.group)
        if weight is self._source:  # weight-only: W is frozen, its group ranges are constants
            wmax, wmin = self._range
        else:  # LET changes W every step
            wmax, wmin = x.amax(-1, keepdim=True), x.amin(-1, keepdim=True)
        zero_t = torch.zeros((), device=x.device, dtype=x.dtype)
        xmax = torch.maximum(torch.sigmoid(self.upbound) * wmax, zero_t)
        xmin = torch.minimum(torch.sigmoid(self.lowbound) * wmin, zero_t)
        scale = ((xmax - xmin) / ((1 << self.bits) - 1)).clamp(min=1e-5, max=1e4)
        zero = (-xmin / scale).clamp(min=-1e4, max=1e4).round()
        return x, scale, zero

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        x, scale, zero = self.grid(weight)
        return _GridQuant.apply(x, scale, zero, (1 << self.bits) - 1).reshape(weight.shape)

    def unfused(self, weight: torch.Tensor) -> torch.Tensor:
        """The same fake quantization as plain autograd ops (what the fused version is tested against)."""
        x, scale, zero = self.grid(weight)
        q = torch.clamp(round_ste(x / scale) + zero, 0, (1 << self.bits) - 1)
        return ((q - zero) * scale).reshape(weight.shape)

    @torch.no_grad()
    def pack(self, weight: torch.Tensor, scale_dtype: torch.dtype):
        """(IntWeight, dequantized weight): the learned clipping as the grid, scales in ``scale_dtype``."""
        n, k = weight.shape
        x, scale, zero = self.grid(weight)
        scale = scale.to(scale_dtype).float()
        scale = torch.where(scale > 0, scale, torch.finfo(scale_dtype).tiny)
        codes = torch.clamp(torch.round(x / scale) + zero, 0, (1 << self.bits) - 1)
        deq = ((codes - zero) * scale).reshape(n, k)
        groups = k // self.group
        packed, why = pack_int(
            codes.to(torch.uint8).reshape(n, k),
            scale.reshape(n, groups).t(),
            zero.reshape(n, groups).t(),
            self.bits,
            None,
            scale_dtype,
        )
        if packed is None:
            raise ConfigError(why)
        return packed, deq


class OmniQuantMethod(BlockMethod):
    """OmniQuant as a block method of the engine (needs the float stream's targets)."""

    name = "omniquant"
    needs_targets = True

    def __init__(self, cfg: OmniQuantConfig, *, scale_dtype: torch.dtype = SCALE_DTYPE, seed: int = 0):
        self.cfg = cfg
        self.scale_dtype = scale_dtype
        self.seed = seed
        self._stat_bytes = 0

    def describe(self) -> dict[str, Any]:
        return {
            **self.cfg.to_dict(),
            "mode": self.cfg.mode,
            "let": self.cfg.use_let,
            "scale_dtype": dtype_name(self.scale_dtype),
            "seed": self.seed,
        }

    def statistics_bytes(self) -> int:
        return self._stat_bytes

    @torch.no_grad()
    def recompute(self, ctx: BlockContext) -> None:
        if self.cfg.act_bits >= 16:
            return super().recompute(ctx)
        act = activation_quantizer(self.cfg.act_bits)
        assert ctx.inputs is not None  # OmniQuant is not data-free
        for start in range(0, ctx.inputs.shape[0], ctx.batch_size):
            part = slice(start, start + ctx.batch_size)
            ctx.inputs[part] = block_forward(ctx.block, ctx.inputs[part], ctx.cos, ctx.sin, act=act)

    def _act_absmax(self, ctx: BlockContext) -> dict[str, torch.Tensor]:
        """Per-channel max |x| at every input site (LET's initialization)."""
        sites = site_modules(block_linears(ctx.block))
        found: dict[str, torch.Tensor] = {}

        def update(site: str, x: torch.Tensor) -> None:
            m = x.abs().reshape(-1, x.shape[-1]).amax(0)
            found[site] = m if site not in found else torch.maximum(found[site], m)

        collect_inputs(ctx.block, ctx.inputs, ctx.cos, ctx.sin, ctx.batch_size, sites, update)
        return found

    def quantize_block(self, ctx: BlockContext) -> dict[str, LayerRecord]:
        cfg = self.cfg
        block = ctx.block
        inputs, targets = ctx.inputs, ctx.targets
        if inputs is None or targets is None:
            raise ValueError("OmniQuant needs the block's inputs and the float block's outputs (targets)")
        torch.manual_seed(self.seed + ctx.index)
        base = {k: v.detach() for k, v in block_weights(block).items()}
        linears = {name: f"{ctx.prefix}{name}" for name in block_linears(block)}
        fit = cfg.group_fit
        lwc = nn.ModuleDict(
            {
                n.replace(".", "_"): LWC(base[n], cfg.bits, cfg.group_size, full, fit)
                for n, full in linears.items()
            }
        )
        let = LETScales(block, self._act_absmax(ctx), cfg.alpha) if cfg.use_let else None
        aug = run_block(block, inputs, ctx.cos, ctx.sin, ctx.batch_size) if cfg.aug_loss else None

        def quantized(weights_in: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            w = let.transform(weights_in) if let is not None else dict(weights_in)
            for n in linears:
                w[n] = lwc[n.replace(".", "_")](w[n])
            return w

        act = activation_quantizer(cfg.act_bits)
        skip = cfg.loss_skip_first
        if skip >= inputs.shape[1]:
            raise ConfigError(
                f"loss_skip_first={skip}: the calibration windows have only {inputs.shape[1]} positions"
            )

        def block_loss(index: slice) -> torch.Tensor:
            x = inputs[index]
            out = block_forward(block, x, ctx.cos, ctx.sin, weights=quantized(base), act=act)[:, skip:]
            loss = F.mse_loss(out, targets[index, skip:])
            if aug is not None:
                loss = loss + F.mse_loss(out, aug[index, skip:])
            return loss

        def mean_loss() -> float:
            with torch.no_grad():
                step = max(ctx.batch_size, cfg.batch_size)
                total = sum(
                    float(block_loss(slice(i, i + step))) * min(step, inputs.shape[0] - i)
                    for i in range(0, inputs.shape[0], step)
                )
            return total / inputs.shape[0]

        groups: list[dict[str, Any]] = [{"params": list(lwc.parameters()), "lr": cfg.lwc_lr}]
        if let is not None:
            groups.append({"params": list(let.parameters()), "lr": cfg.let_lr})
        n_params = sum(p.numel() for g in groups for p in g["params"])
        self._stat_bytes = 4 * n_params * 4 + (0 if aug is None else aug.numel() * aug.element_size())
        init_loss = mean_loss()
        losses = [init_loss]
        if cfg.epochs:
            optimizer = torch.optim.AdamW(groups, weight_decay=cfg.wd)
            steps = inputs.shape[0] // cfg.batch_size
            for epoch in range(cfg.epochs):
                total = 0.0
                for j in range(steps):
                    loss = block_loss(slice(j * cfg.batch_size, (j + 1) * cfg.batch_size))
                    if not math.isfinite(loss.item()):
                        raise ConfigError(
                            f"block {ctx.index}: OmniQuant loss became {loss.item()} in epoch {epoch} "
                            "(lower lwc_lr/let_lr)"
                        )
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                    total += loss.item()
                losses.append(total / max(steps, 1))
                ctx.report(f"epoch {epoch + 1}/{cfg.epochs} mse {losses[-1]:.3g} (init {init_loss:.3g})")
        final_loss = mean_loss()
        return self._fold(ctx, base, lwc, let, linears, init_loss, final_loss, losses)

    @torch.no_grad()
    def _fold(self, ctx, base, lwc, let, linears, init_loss, final_loss, losses) -> dict[str, LayerRecord]:
        """Write the equivalent weights and the packed learned grid into the block."""
        block = ctx.block
        folded = let.transform(base) if let is not None else base
        if block.attn is not None:
            block.attn_norm.weight.copy_(folded["attn_norm"])
        if block.mlp is not None:
            block.mlp_norm.weight.copy_(folded["mlp_norm"])
        records: dict[str, LayerRecord] = {}
        modules = block_linears(block)
        for name, canonical in linears.items():
            packed, deq = lwc[name.replace(".", "_")].pack(folded[name], self.scale_dtype)
            modules[name].weight.copy_(deq.to(modules[name].weight.dtype))
            records[canonical] = LayerRecord(
                packed=packed.to("cpu"),
                extra={"block_mse_init": init_loss, "block_mse_final": final_loss},
            )
        first = next(iter(records.values()), None)
        if first is not None:
            first.extra["epoch_losses"] = losses
        return records


def _unwritable(cfg: OmniQuantConfig) -> str | None:
    if cfg.act_bits < 16:
        return (
            f"{cfg.mode} quantizes activations per token, but the QuantLM runtime (trilm.infer with "
            "trilm.kernels.QuantLinear) has no activation quantizer: a written QuantLM would run with float "
            "activations and not be the W4A4 model. Evaluate weight-activation modes in process "
            "(trilm.posthoc.blockfn.forward_with_activation_quant; benchmarks/posthoc/quantize.py --w4a4)"
        )
    return None


register_block_method(
    "omniquant",
    OmniQuantConfig,
    lambda cfg, opts: OmniQuantMethod(cfg, scale_dtype=opts.scale_dtype, seed=opts.seed),
    "OmniQuant: learnable weight clipping (+ LET for weight-activation modes), block-wise",
    paper_bits=lambda cfg: gptq_bits(cfg.bits, cfg.group_size if cfg.group_size > 0 else None),
    unwritable=_unwritable,
)
