"""How far a quantized model drifts from its float model: block by block, on its own calibration data, and
with its first position pinned to the float model's.

OmniQuant trains each block's clipping to minimise ``MSE(float block output, quantized block output)`` with
the quantized model's own inputs; :func:`divergence` measures that quantity after every block of a finished
model, together with the share of it at each window's first position, at the single worst (window, position)
and the float stream's largest |h| (massive activations, which make a few positions dominate a mean).
:func:`calibration_nll` tells under-fitting from over-fitting (a method worse on the very data it was fitted
to under-fits its objective), and :class:`FloatFirstPosition` gives the perplexity a model would score if
its massive-activation position were exact. Both models are :class:`trilm.infer.InferenceModel`-shaped
(``embed``, ``rope``, ``layers``, ``norm``, ``head``). ``python -m experiments.posthoc_real.blocks`` runs
them on the real-model rows; the experiment's report renders a summary.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def divergence(float_model, quant_model, windows: torch.Tensor, batch: int) -> list[dict]:
    """Per block: mse, share of the squared error at position 0 and at the worst position, float max |h|."""
    n_layers = len(float_model.layers)
    sums = torch.zeros(n_layers, dtype=torch.float64)
    first = torch.zeros(n_layers, dtype=torch.float64)
    worst = torch.zeros(n_layers, dtype=torch.float64)
    peak = torch.zeros(n_layers, dtype=torch.float64)
    count = 0
    for start in range(0, windows.shape[0], batch):
        ids = windows[start : start + batch]
        xf, xq = float_model.embed(ids), quant_model.embed(ids)
        cos, sin = float_model.rope(ids.shape[1], xf.dtype)
        for i, (bf, bq) in enumerate(zip(float_model.layers, quant_model.layers, strict=True)):
            xf, xq = bf(xf, cos, sin), bq(xq, cos, sin)
            err = (xq - xf).double().pow(2).sum(-1)
            sums[i] += err.sum()
            first[i] += err[:, 0].sum()
            worst[i] = max(worst[i], err.max())
            peak[i] = max(peak[i], xf.abs().max().double())
        count += ids.numel() * xf.shape[-1]
    total = sums.clamp_min(1e-30)
    return [
        {
            "block": i,
            "mse": float(sums[i] / count),
            "share_first_position": float(first[i] / total[i]),
            "largest_position_share_bound": float(worst[i] / total[i]),
            "float_max_abs": float(peak[i]),
        }
        for i in range(n_layers)
    ]


@torch.no_grad()
def calibration_nll(model, windows: torch.Tensor, batch: int) -> float:
    """Mean next-token NLL (nats) on the calibration windows themselves. A method that is worse than another
    on the very data it was fitted to under-fits its objective; one that is better there but worse on held-out
    text over-fits."""
    total, count = 0.0, 0
    for start in range(0, windows.shape[0], batch):
        ids = windows[start : start + batch]
        logits = model(ids)[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum"
        )
        total, count = total + float(nll), count + ids[:, 1:].numel()
    return total / count


class FloatFirstPosition(torch.nn.Module):
    """A quantized model whose first position is the float model's after every block (``pin=False``: the
    quantized model as it is). Its perplexity is what the model would score if its massive-activation position
    were exact; the prediction made at position 0 (one token per window) becomes the float model's too."""

    def __init__(self, quant_model, float_model, pin: bool = True):
        super().__init__()
        self.quant_model, self.float_model, self.pin = quant_model, float_model, pin

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        xq = self.quant_model.embed(input_ids)
        xf = self.float_model.embed(input_ids) if self.pin else None
        cos, sin = self.quant_model.rope(input_ids.shape[1], xq.dtype)
        for i, layer in enumerate(self.quant_model.layers):
            xq = layer(xq, cos, sin)
            if xf is not None:
                xf = self.float_model.layers[i](xf, cos, sin)
                xq[:, 0] = xf[:, 0]
        return self.quant_model.head(self.quant_model.norm(xq))
