"""Whole-model drivers of the binary methods where a model needs more than one layer at a time:

- **STBLLM's adaptive per-layer N**: before the first block, one pass of the float model over the
  calibration windows measures each decoder layer's outlier ratio (share of the standardized importance of
  its linears above 6× each linear's mean, with the input channels' activation norms — OWL's layer-wise
  outlier distribution); :func:`~trilm.posthoc.binarize.adaptive_keep` turns the ratios into N per decoder
  layer around the configured N (mean kept share preserved), and its linears are quantized with that N.
  ``adaptive_unit="linear"`` gives every linear its own ratio and N instead; on the evidence model that
  hurts (the ratio then mostly tells linear *types* apart — w_down's inputs have the outlier channels — and
  the attention and gate/up projections lose a kept weight per group; docs/posthoc.md).
- **PB-LLM's QAT** (``qat_steps > 0``): after PB-GPTQ has quantized every block, the binary part of the whole
  model is trained with STE (:mod:`trilm.posthoc.qat`) on the training text — ``qat_data``, or the
  calibration source — and the retrained layers replace the PTQ ones.

Both register as the model-level ``pbllm``/``stbllm`` of ``trilm quantize``; without adaptive N or QAT they
behave exactly as the plain layer-wise driver.
"""

from __future__ import annotations

from typing import Any, cast

import torch

from trilm.config import ConfigError
from trilm.data.text_source import token_stream
from trilm.formats import PartialBinaryWeight
from trilm.infer.model import block_linears
from trilm.model.spec import BY_NAME
from trilm.posthoc.billm import STBLLMConfig
from trilm.posthoc.binarize import adaptive_keep, outlier_ratio, standardized_importance
from trilm.posthoc.engine import EngineConfig, LayerRecord, collect_inputs, run_block, site_modules
from trilm.posthoc.layerwise import LayerwiseMethod
from trilm.posthoc.pbllm import PBLLMConfig
from trilm.posthoc.qat import QATSettings, train_binary_part
from trilm.posthoc.registry import MethodOptions, QuantResult, set_driver


class STBLLMModelMethod(LayerwiseMethod):
    """STBLLM with per-layer N from the float model's outlier ratios."""

    cfg: STBLLMConfig

    def __init__(self, cfg: STBLLMConfig, opts: MethodOptions):
        super().__init__("stbllm", cfg, true_sequential=opts.true_sequential, scale_dtype=opts.scale_dtype)
        self.layer_n: dict[str, int] = {}
        self.ratios: dict[str, float] = {}

    @torch.no_grad()
    def prepare(self, model, inputs, cos, sin, cfg: EngineConfig) -> None:
        c = self.cfg
        if not c.adaptive_n or c.n == c.m:
            return
        device = inputs.device
        x = inputs.clone()
        sizes: dict[str, int] = {}
        units: dict[str, list[str]] = {}
        for index, block in enumerate(model.layers):
            block.to(device)
            linears = block_linears(block)
            sites = site_modules(linears)
            squares = {site: torch.zeros(m.weight.shape[1], device=device) for site, m in sites.items()}

            def add(site: str, t: torch.Tensor, squares=squares) -> None:
                squares[site] += t.float().pow(2).reshape(-1, t.shape[-1]).sum(0)

            collect_inputs(block, x, cos, sin, cfg.batch_size, sites, add)
            block_outliers = block_size = 0
            for name, module in linears.items():
                act = squares[BY_NAME[name].site].sqrt()
                si = standardized_importance(module.weight.float(), act)
                if c.adaptive_unit == "linear":
                    canonical = f"layers.{index}.{name}"
                    self.ratios[canonical] = outlier_ratio(si)
                    sizes[canonical] = module.weight.numel()
                    units[canonical] = [canonical]
                block_outliers += outlier_ratio(si) * si.numel()
                block_size += si.numel()
            if c.adaptive_unit == "block" and linears:
                unit = f"layers.{index}"
                self.ratios[unit] = block_outliers / block_size
                sizes[unit] = block_size
                units[unit] = [f"{unit}.{name}" for name in linears]
            run_block(block, x, cos, sin, cfg.batch_size, out=x)
            block.to("cpu")
        names = list(self.ratios)
        keep = adaptive_keep([self.ratios[n] for n in names], [sizes[n] for n in names], c.n, c.m)
        self.layer_n = {linear: k for unit, k in zip(names, keep, strict=True) for linear in units[unit]}

    def layer_config(self, canonical: str) -> STBLLMConfig:
        n = self.layer_n.get(canonical)
        return self.cfg if n is None else self.cfg.replace(n=n)

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        if self.layer_n:
            out["layer_n"] = dict(self.layer_n)
            out["outlier_ratio"] = {k: round(v, 6) for k, v in self.ratios.items()}
        return out


class PBLLMModelMethod(LayerwiseMethod):
    """PB-GPTQ, then (``qat_steps > 0``) the binary part of the whole model trained with STE."""

    cfg: PBLLMConfig

    def __init__(self, cfg: PBLLMConfig, opts: MethodOptions):
        super().__init__("pbllm", cfg, true_sequential=opts.true_sequential, scale_dtype=opts.scale_dtype)
        self.options = opts
        self.latents: dict[str, torch.Tensor] = {}
        self.qat_losses: list[float] = []

    def layer_done(self, canonical: str, result: QuantResult) -> None:
        if self.cfg.qat_steps:
            self.latents[canonical] = result.extra.pop("latent").cpu()

    def finish(self, model, layers: dict[str, LayerRecord], cfg: EngineConfig) -> dict[str, LayerRecord]:
        c = self.cfg
        if not c.qat_steps:
            return layers

        calib = self.options.calibration
        source = c.qat_data or (calib.source if calib is not None else "")
        if not source:
            raise ConfigError("qat_data: PB-LLM QAT needs training text (qat_data or a calibration source)")
        seq = calib.seq_len if calib is not None else min(256, model.cfg.context)
        split = calib.split if calib is not None else "train"
        tokens = token_stream(source, self.options.tokenizer, split=split)
        settings = QATSettings(c.qat_steps, c.qat_lr, c.qat_batch, seq, seed=self.options.seed)
        # PB-GPTQ packs every layer as a PartialBinaryWeight
        packed = {name: cast(PartialBinaryWeight, rec.packed) for name, rec in layers.items()}
        trained, self.qat_losses = train_binary_part(
            model, packed, self.latents, tokens, settings, device=cfg.device, progress=cfg.progress
        )
        self.latents.clear()
        out = {}
        for name, rec in layers.items():
            extra = {**rec.extra, "proxy_loss_before_qat": rec.proxy_loss}
            out[name] = LayerRecord(trained[name], None, rec.seconds, extra)
        return out

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        if self.qat_losses:
            window = max(1, len(self.qat_losses) // 10)
            out["qat_loss_first"] = sum(self.qat_losses[:window]) / window
            out["qat_loss_last"] = sum(self.qat_losses[-window:]) / window
            out["qat_loss_window"] = window
        return out


set_driver("stbllm", STBLLMModelMethod, "per-layer N from outlier ratios (adaptive_n)")
set_driver("pbllm", PBLLMModelMethod, "--qat-steps N trains the binary part with STE")
