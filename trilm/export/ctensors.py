"""``trilm export compressed-tensors QUANTLM OUT``: an int weight-only QuantLM as llmcompressor writes one.

vLLM serves these checkpoints with its Marlin/Machete kernels (4- and 8-bit) and transformers loads them with
the ``compressed-tensors`` package installed, so a GPTQ/RTN QuantLM keeps its size outside trilm. The
directory is an HF export (config, tokenizer files with the chat template, model card: :mod:`trilm.export.hf`
writes them) whose block linears are stored in the ``pack-quantized`` format, packed by the library's own
``pack_to_int32``: ``weight_packed`` (int32, codes − 2^(b−1) packed along K), ``weight_scale`` (N, K / g),
``weight_zero_point`` (asymmetric only: zero − 2^(b−1), packed along N), ``weight_shape``; and
``quantization_config`` in ``config.json`` written by the library's ``ModelCompressor`` (one config group
per distinct scheme, targets by module name; the head stays dense, as llmcompressor's ``ignore``).

A trilm int code c with zero z and scale s is w = s · (c − z); compressed-tensors decodes (q − zp) · s with
q = c − 2^(b−1), zp = z − 2^(b−1): the same numbers, so nothing is re-quantized. What the format cannot hold
is refused by layer and reason, never approximated: ternary/binary models, PB-LLM, BiLLM and STBLLM layers
(no int grid with one scale and zero per group), act-order ``g_idx`` (compressed-tensors 0.20 no longer
reads ``weight_g_idx``: its ``actorder=group`` was removed), llama.cpp Q4_1's float mins (its zero points are
integers), and scales the chosen dtype would round. ``--dequantized`` writes the dense HF export instead,
and says so.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from trilm.config import ConfigError
from trilm.dtypes import parse_dtype
from trilm.export.common import export_directory, open_source
from trilm.export.hf import export_snapshot_hf, float_state, special_ids, tie_state, write_companions
from trilm.formats import IntWeight, PackedWeight
from trilm.model.hf import hf_name
from trilm.model.spec import canonical_shapes
from trilm.store.hf import write_hf_config
from trilm.store.layout import HF_WEIGHTS
from trilm.store.open import ModelDir
from trilm.store.tensors import write_tensors

KIND = "compressed-tensors"
FORMAT = "pack-quantized"

Scheme = tuple[int, int | None, bool]
"""(bits, group size or None for per-channel, symmetric)."""


@dataclasses.dataclass
class CTReport:
    path: Path
    dequantized: bool
    schemes: dict[Scheme, int]
    bytes: int

    def summary(self) -> str:
        if self.dequantized:
            return f"wrote {self.path}: dense (dequantized) LlamaForCausalLM, not compressed-tensors"
        parts = [
            f"W{b}{'' if g is None else f' g{g}'} {'sym' if sym else 'asym'} × {n}"
            for (b, g, sym), n in self.schemes.items()
        ]
        return (
            f"wrote {self.path} ({FORMAT}: {', '.join(parts)} layers; {self.bytes / 2**20:.2f} MiB of "
            "weights; loads in transformers with compressed-tensors, and in vLLM)"
        )


def _method(src: ModelDir) -> str:
    quant = src.meta.extra.get("quant") or {}
    return str(quant.get("method") or "unknown method")


def refusal(src: ModelDir) -> str | None:
    """Why compressed-tensors cannot hold this model's weights (None: it can, layer by layer)."""
    cfg = src.config
    if cfg.family != "floatlm":
        return (
            f"a {cfg.family} model: its block weights are {cfg.weight_format}, not a post-hoc int grid, and "
            "compressed-tensors has no ternary/binary type (export gguf --type tq2_0 or export packed keep "
            "its size)"
        )
    packed = src.weights.packed_layers()
    if not packed:
        return "a float model: nothing is quantized (export hf writes it dense)"
    for key, weight in packed.items():
        why = layer_refusal(weight, _method(src))
        if why:
            return f"{hf_name(key + '.weight')}: {why}"
    return None


def layer_refusal(weight: PackedWeight, method: str) -> str | None:
    """Why one packed layer has no pack-quantized form (None: it has one)."""
    if not isinstance(weight, IntWeight):
        return (
            f"{method} stores it as {weight.FORMAT!r} (binary codes with masks or salient weights), not an "
            f"int grid with one scale and zero point per group, which is all {FORMAT} holds"
        )
    if weight.g_idx is not None:
        return (
            f"{method} act-order g_idx: compressed-tensors no longer reads weight_g_idx (actorder=group was "
            "removed), so the permuted groups would load wrong; quantize with --static-groups"
        )
    if weight.mins is not None:
        return "float mins (llama.cpp Q4_1's grid): compressed-tensors' zero points are integers"
    half = 1 << (weight.bits - 1)
    zp = weight.zeros.int() - half
    if weight.zeros.numel() and (int(zp.min()) < -half or int(zp.max()) >= half):
        return f"a zero point outside the signed {weight.bits}-bit range compressed-tensors stores"
    return None


def layer_tensors(weight: IntWeight, dtype: torch.dtype, name: str) -> tuple[dict[str, torch.Tensor], Scheme]:
    """The pack-quantized tensors of one layer (suffix → tensor) and its scheme."""
    # optional dependency: compressed_tensors (the dev extra)
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    n, k = weight.shape
    bits, half, g = weight.bits, 1 << (weight.bits - 1), weight.group_size
    scale = weight.scales.t().contiguous()
    if not torch.equal(scale.to(dtype).float(), scale.float()):
        raise ConfigError(
            f"--dtype {dtype}: {name}'s {weight.scales.dtype} scales are not exact in {dtype} (scales are "
            "stored in the model dtype); use --dtype float16 or float32"
        )
    q = (weight.codes().to(torch.int16) - half).to(torch.int8)
    zp = (weight.zeros.t().to(torch.int16) - half).to(torch.int8).contiguous()
    sym = bool((zp == 0).all())
    out = {
        "weight_packed": pack_to_int32(q, bits),
        "weight_scale": scale.to(dtype),
        "weight_shape": torch.tensor([n, k]),
    }
    if not sym:
        out["weight_zero_point"] = pack_to_int32(zp, bits, packed_dim=0)
    return out, (bits, None if g == k else g, sym)


def quantization_config(schemes: dict[Scheme, list[str]], act_order: bool) -> Any:
    """The library's QuantizationConfig: one group per scheme (all ``Linear`` when one scheme covers every
    block linear, as llmcompressor writes it; module names otherwise), the head ignored."""
    # optional dependency: compressed_tensors (the dev extra)
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        QuantizationStatus,
    )

    groups = {}
    for i, ((bits, g, sym), names) in enumerate(sorted(schemes.items(), key=lambda kv: str(kv[0]))):
        args = QuantizationArgs(
            num_bits=bits,
            type="int",
            symmetric=sym,
            strategy="channel" if g is None else "group",
            group_size=g,
            actorder="weight" if act_order else None,
        )
        targets = ["Linear"] if len(schemes) == 1 else names
        groups[f"group_{i}"] = QuantizationScheme(targets=targets, weights=args)
    return QuantizationConfig(
        config_groups=groups,
        format=FORMAT,
        quantization_status=QuantizationStatus.COMPRESSED,
        ignore=["lm_head"],
    )


def export_snapshot_ctensors(
    snapshot: str | Path,
    out: str | Path,
    *,
    dtype: str = "float16",
    dequantized: bool = False,
    tokenizer: str | Path | None = None,
    src: ModelDir | None = None,
) -> CTReport:
    """Write the compressed-tensors export of a QuantLM (atomically), or refuse it naming the reason."""
    src = src or open_source(snapshot, tokenizer=tokenizer, require_tokenizer=True)
    if dequantized:
        path = export_snapshot_hf(src.path, out, dtype=dtype, src=src)
        return CTReport(path, True, {}, (path / HF_WEIGHTS).stat().st_size)
    why = refusal(src)
    if why:
        raise ConfigError(
            f"{src.given}: {KIND} cannot hold this model: {why} (--dequantized writes a dense checkpoint)"
        )
    # optional dependency: compressed_tensors (the dev extra)
    from compressed_tensors.compressors import ModelCompressor

    weight_dtype = parse_dtype(dtype, "--dtype")
    cfg = src.config
    packed = src.weights.packed_layers()
    state = float_state(src)
    bos, eos = special_ids(src)
    tied, _ = tie_state(src, state)
    tensors: dict[str, torch.Tensor] = {}
    schemes: dict[Scheme, list[str]] = {}
    for key in canonical_shapes(cfg):
        name = hf_name(key)
        if tied and key == "head.weight":
            continue
        weight = packed.get(key.removesuffix(".weight"))
        if weight is None:
            tensors[name] = state[key].to(weight_dtype)
            continue
        assert isinstance(weight, IntWeight)
        module = name.removesuffix(".weight")
        parts, scheme = layer_tensors(weight, weight_dtype, module)
        tensors.update({f"{module}.{suffix}": t for suffix, t in parts.items()})
        schemes.setdefault(scheme, []).append(module)
    options = (src.meta.extra.get("quant") or {}).get("options") or {}
    qconfig = quantization_config(schemes, bool(options.get("act_order")))
    with export_directory(out, KIND, src, dtype=dtype, tied_embeddings=tied) as tmp:
        write_tensors(tmp / HF_WEIGHTS, tensors, metadata={"format": "pt"})
        write_hf_config(cfg, tmp, weight_dtype, bos_token_id=bos, eos_token_id=eos, tied=tied)
        ModelCompressor(quantization_config=qconfig).update_config(str(tmp))
        write_companions(src, tmp, {"weights": f"{HF_WEIGHTS} ({FORMAT}, {dtype} scales and dense tensors)"})
    size = (Path(out) / HF_WEIGHTS).stat().st_size
    return CTReport(Path(out), False, {s: len(v) for s, v in schemes.items()}, size)
