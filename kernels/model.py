"""Swap a trilm decoder's block linears for packed :class:`QuantLinear` layers (inference).

TriLM/BiLM layers are packed from the model's own quantizer (``packing_scales``: the integer codes and the
scales of the scale group the model trained with), so the packed model computes the fake-quantized model's
function. A FloatLM can be packed to an int format with the uniform round-to-nearest grid, the baseline the
post-hoc methods (GPTQ, OmniQuant) improve on.
"""

from __future__ import annotations

from torch import nn

from kernels.linear import QuantLinear, replace_linears
from trilm.formats import BinaryWeight, TernaryWeight
from trilm.model.quant import packing_scales

INT_FORMATS = {"int2": 2, "int3": 3, "int4": 4}


def pack_decoder(model: nn.Module, fmt: str = "native", group_size: int = 128, **linear_opts) -> list[str]:
    """Replace every quantized block linear in place; returns the replaced module names.

    ``fmt="native"`` packs a TriLM as ternary and a BiLM as binary with their trained scales;
    ``"int2" | "int3" | "int4"`` packs the latent float weights with ``group_size`` groups (RTN, asymmetric).
    Only a TP=1 model can be packed (its weights are whole matrices).
    """
    if getattr(model, "tp_size", 1) != 1:
        raise ValueError("pack_decoder needs a tensor-parallel degree of 1; load the snapshot with tp=1")
    targets = {id(m) for m in model.quantized_linears()}
    if fmt == "native":
        if model.cfg.family == "floatlm":
            raise ValueError("a FloatLM has no native low-bit format; choose int2, int3 or int4")

        def make(name: str, layer: nn.Module) -> nn.Module:
            codes, scales, _ = packing_scales(layer.weight.detach(), layer.layout)
            cls = BinaryWeight if layer.layout.fmt == "binary" else TernaryWeight
            return QuantLinear(cls.pack(codes, scales), **linear_opts)

    elif fmt in INT_FORMATS:
        if model.cfg.family != "floatlm":
            raise ValueError(f"{fmt} packs float weights; a {model.cfg.family} is packed with fmt='native'")

        def make(name: str, layer: nn.Module) -> nn.Module:
            w = layer.weight.detach()
            group = group_size if w.shape[1] % group_size == 0 else w.shape[1]
            return QuantLinear.from_float(w, "int", bits=INT_FORMATS[fmt], group_size=group, **linear_opts)

    else:
        raise ValueError(f"unknown format {fmt!r}: choose native, {', '.join(INT_FORMATS)}")
    return replace_linears(model, lambda name, child: id(child) in targets, make)
