"""The packing codec: one packed format per weight family, shared by export, kernels and the serving engine.

| format | class | bits/weight (storage, metadata included) |
|---|---|---|
| ``ternary`` | :class:`TernaryWeight` | 2 + scale bits·(K/g)/K (2.004 per-row fp32 at K = 8192) |
| ``binary`` | :class:`BinaryWeight` | 1 + (scale [+ mean] bits)/g |
| ``nm_binary`` | :class:`NMBinaryWeight` | 1 + N/M + scale bits/g (2:4 → 1.5) |
| ``multibinary`` | :class:`MultiBinaryWeight` | n_bits + table bits·classes·2^n_bits/block (BiLLM ≈ 3.0) |
| ``int`` | :class:`IntWeight` | b + (scale bits + 8 [+ min bits])/g (int4 g128 fp16 → 4.19) |
| ``pbllm`` | :class:`PBLLMWeight` | 1 + salient share·(8 + 16) + row tables (10 % → ≈ 3.4) |
| ``partial_binary`` | :class:`PartialBinaryWeight` | PB-LLM compact: Elias–Fano salient set (10 % → ≈ 2.23) |
| ``residual_binary`` | :class:`ResidualBinaryWeight` | BiLLM/STBLLM compact: signs, N:M ranks, group digits |

The last two are storage layouts (within 10 % + 0.05 bit of the information-theoretic minimum of the
method's output, :func:`~trilm.formats.accounting.layer_bits`); ``kernel_layout()`` converts them once into
a format the kernels decode. llama.cpp's Q4_0/Q4_1/Q8_0 blocks are ``int`` grids
(:mod:`trilm.formats.ggml` fits them and writes their bytes).

Every class has ``pack(...)`` from integer codes, ``dequantize()``, ``to_tensors()/meta()``,
``from_tensors()`` and ``decode_args()`` (its kernel id and tensors by role, :mod:`trilm.formats.decode`);
:func:`save_packed`/:func:`load_packed` hold many layers in one safetensors file. This package imports
nothing from the kernels or the model.
"""

from trilm.formats.accounting import (
    billm_bits,
    billm_storing_bits,
    gptq_bits,
    layer_bits,
    model_bits_summary,
    pbllm_bits,
    stbllm_bits,
    within_budget,
)
from trilm.formats.base import FORMATS, SCALE_DTYPE, FormatError, PackedWeight, from_tensors
from trilm.formats.binary import BinaryWeight
from trilm.formats.decode import AFFINE_KERNELS, DecodeArgs, KernelId
from trilm.formats.ggml import GGML_TYPES, fit_ggml_grid, ggml_blocks, ggml_codes, ggml_type_of, ggml_values
from trilm.formats.intk import IntWeight, fit_uniform_grid, quantize_to_grid, quantize_uniform
from trilm.formats.io import decode_packed, load_packed, save_packed
from trilm.formats.multibinary import MultiBinaryWeight, ResidualGroup, residual_value
from trilm.formats.nm import NMBinaryWeight, check_nm_pattern
from trilm.formats.partial import PartialBinaryWeight
from trilm.formats.pbllm import PBLLMWeight
from trilm.formats.residual import ResidualBinaryWeight
from trilm.formats.ternary import TernaryWeight, partition_scales

__all__ = [
    "AFFINE_KERNELS",
    "FORMATS",
    "GGML_TYPES",
    "SCALE_DTYPE",
    "BinaryWeight",
    "DecodeArgs",
    "FormatError",
    "IntWeight",
    "KernelId",
    "MultiBinaryWeight",
    "NMBinaryWeight",
    "PBLLMWeight",
    "PackedWeight",
    "PartialBinaryWeight",
    "ResidualBinaryWeight",
    "ResidualGroup",
    "TernaryWeight",
    "billm_bits",
    "billm_storing_bits",
    "check_nm_pattern",
    "decode_packed",
    "fit_ggml_grid",
    "fit_uniform_grid",
    "from_tensors",
    "ggml_blocks",
    "ggml_codes",
    "ggml_type_of",
    "ggml_values",
    "gptq_bits",
    "layer_bits",
    "load_packed",
    "model_bits_summary",
    "partition_scales",
    "pbllm_bits",
    "quantize_to_grid",
    "quantize_uniform",
    "residual_value",
    "save_packed",
    "stbllm_bits",
    "within_budget",
]
