"""``trilm export compressed-tensors QUANTLM OUT``: an int weight-only QuantLM as llmcompressor writes one.

transformers loads these directories with the ``compressed-tensors`` package installed, so a GPTQ/RTN
QuantLM keeps its size outside trilm (``AutoModelForCausalLM.from_pretrained`` on every scheme the export
writes is what ``tests/export/test_ctensors.py`` checks, at the versions ``make install`` pins). The
directory is an HF export (config, tokenizer files with the chat template, model card: :mod:`trilm.export.hf`
writes them) whose block linears are stored in the ``pack-quantized`` format, packed by the library's own
``pack_to_int32``: ``weight_packed`` (int32, codes − 2^(b−1) packed along K), ``weight_scale`` (N, K / g),
``weight_zero_point`` (asymmetric only: zero − 2^(b−1), packed along N), ``weight_shape``; and
``quantization_config`` in ``config.json`` written by the library's ``ModelCompressor`` (one config group
per distinct scheme, targets by module name; the head stays dense, as llmcompressor's ``ignore``).

A trilm int code c with zero z and scale s is w = s · (c − z); compressed-tensors decodes (q − zp) · s with
q = c − 2^(b−1), zp = z − 2^(b−1): the same numbers, so nothing is re-quantized. Symmetry is the model's:
when any layer has a zero point off 2^(b−1), every layer is written asymmetric (a layer whose zero points
happen to sit at the middle gets them stored as zeros), so one scheme covers a uniform grid.

Asymmetric checkpoints carry ``"dequantize": true`` in their ``quantization_config``. transformers builds
the empty model compressed before loading, and compressed-tensors 0.20's meta-device compression leaves
each ``weight_zero_point`` at its unpacked (N, K / g) shape while the checkpoint and the library's own
decompressor hold it packed along N (ceil(N · b / 32), K / g): ``from_pretrained`` then stops on a size
mismatch for every layer (llm-compressor issue 1618). With ``dequantize`` set, transformers instead runs
the library's decompressor on each layer's checkpoint tensors as they load, which reads the packed zero
points; that path decompresses every layer with one scheme, so an asymmetric model whose layers need
several (different group sizes) is refused. The tensors stay llmcompressor's layout either way.

What the format cannot hold is refused by layer and reason, never approximated: ternary/binary models,
PB-LLM, BiLLM and STBLLM layers (no int grid with one scale and zero per group), act-order ``g_idx``
(compressed-tensors 0.20 has no ``actorder=group`` and reads no ``weight_g_idx``), llama.cpp Q4_1's
float mins (its zero points are integers), and scales the chosen dtype would round. ``--dequantized``
writes the dense HF export instead, and says so.
"""

from __future__ import annotations

import dataclasses
import json
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
        asym = not all(sym for _, _, sym in self.schemes)
        load = (
            "transformers' AutoModelForCausalLM.from_pretrained loads it with compressed-tensors installed"
            + (", dequantizing the weights as they load" if asym else "")
        )
        size = f"{self.bytes / 2**20:.2f} MiB of weights"
        return f"wrote {self.path} ({FORMAT}: {', '.join(parts)} layers; {size}; {load})"


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
    ints = {key: w for key, w in packed.items() if isinstance(w, IntWeight)}
    schemes = layer_schemes(ints)
    distinct = sorted(set(schemes.values()), key=str)
    if len(distinct) > 1 and not distinct[0][2]:
        counts = ", ".join(
            f"W{b} {'per-channel' if g is None else f'g{g}'} × {list(schemes.values()).count((b, g, sym))}"
            for b, g, sym in distinct
        )
        return (
            f"asymmetric layers with different schemes ({counts}): transformers loads asymmetric {FORMAT} "
            "checkpoints only by dequantizing them as they load, which decodes every layer with one scheme; "
            "quantize with one group size that divides every layer's in_features (or --group-size -1), or "
            "with --sym"
        )
    return None


def layer_schemes(packed: dict[str, IntWeight]) -> dict[str, Scheme]:
    """Each layer's scheme as written: the model's symmetry (asymmetric when any zero point is off the middle
    of the grid) and the layer's group size, or per-channel when every layer's group is its whole row (a
    one-group layer of a grouped model is a group of its row's width, so it shares its neighbours' scheme
    when the widths agree)."""
    sym = all(bool((w.zeros.int() == 1 << (w.bits - 1)).all()) for w in packed.values())
    per_row = all(w.group_size == w.in_features for w in packed.values())
    return {key: (w.bits, None if per_row else w.group_size, sym) for key, w in packed.items()}


def layer_refusal(weight: PackedWeight, method: str) -> str | None:
    """Why one packed layer has no pack-quantized form (None: it has one)."""
    if not isinstance(weight, IntWeight):
        return (
            f"{method} stores it as {weight.FORMAT!r} (binary codes with masks or salient weights), not an "
            f"int grid with one scale and zero point per group, which is all {FORMAT} holds"
        )
    if weight.g_idx is not None:
        return (
            f"{method} act-order g_idx: compressed-tensors 0.20 reads no weight_g_idx (it has no "
            "actorder=group), so the permuted groups would load wrong; quantize with --static-groups"
        )
    if weight.mins is not None:
        return "float mins (llama.cpp Q4_1's grid): compressed-tensors' zero points are integers"
    half = 1 << (weight.bits - 1)
    zp = weight.zeros.int() - half
    if weight.zeros.numel() and (int(zp.min()) < -half or int(zp.max()) >= half):
        return f"a zero point outside the signed {weight.bits}-bit range compressed-tensors stores"
    return None


def layer_tensors(
    weight: IntWeight, scheme: Scheme, dtype: torch.dtype, name: str
) -> dict[str, torch.Tensor]:
    """The pack-quantized tensors of one layer written as ``scheme`` (suffix → tensor)."""
    # optional dependency: compressed_tensors (the dev extra)
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    n, k = weight.shape
    bits, half = weight.bits, 1 << (weight.bits - 1)
    scale = weight.scales.t().contiguous()
    if not torch.equal(scale.to(dtype).float(), scale.float()):
        raise ConfigError(
            f"--dtype {dtype}: {name}'s {weight.scales.dtype} scales are not exact in {dtype} (scales are "
            "stored in the model dtype); use --dtype float16 or float32"
        )
    q = (weight.codes().to(torch.int16) - half).to(torch.int8)
    out = {
        "weight_packed": pack_to_int32(q, bits),
        "weight_scale": scale.to(dtype),
        "weight_shape": torch.tensor([n, k]),
    }
    if not scheme[2]:
        zp = (weight.zeros.t().to(torch.int16) - half).to(torch.int8).contiguous()
        out["weight_zero_point"] = pack_to_int32(zp, bits, packed_dim=0)
    return out


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


def dequantize_on_load(config_json: Path) -> None:
    """Set ``quantization_config.dequantize`` in ``config_json``: transformers' load path for asymmetric
    pack-quantized checkpoints at the pinned versions (see the module docstring)."""
    config = json.loads(config_json.read_text())
    config["quantization_config"]["dequantize"] = True
    config_json.write_text(json.dumps(config, indent=2, sort_keys=True))


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
    ints = {key: w for key, w in packed.items() if isinstance(w, IntWeight)}
    layer_scheme = layer_schemes(ints)
    tensors: dict[str, torch.Tensor] = {}
    schemes: dict[Scheme, list[str]] = {}
    for key in canonical_shapes(cfg):
        name = hf_name(key)
        if tied and key == "head.weight":
            continue
        layer = key.removesuffix(".weight")
        weight = ints.get(layer)
        if weight is None:
            tensors[name] = state[key].to(weight_dtype)
            continue
        module = name.removesuffix(".weight")
        parts = layer_tensors(weight, layer_scheme[layer], weight_dtype, module)
        tensors.update({f"{module}.{suffix}": t for suffix, t in parts.items()})
        schemes.setdefault(layer_scheme[layer], []).append(module)
    options = (src.meta.extra.get("quant") or {}).get("options") or {}
    qconfig = quantization_config(schemes, bool(options.get("act_order")))
    with export_directory(out, KIND, src, dtype=dtype, tied_embeddings=tied) as tmp:
        write_tensors(tmp / HF_WEIGHTS, tensors, metadata={"format": "pt"})
        write_hf_config(cfg, tmp, weight_dtype, bos_token_id=bos, eos_token_id=eos, tied=tied)
        ModelCompressor(quantization_config=qconfig).update_config(str(tmp))
        if not all(sym for _, _, sym in schemes):
            dequantize_on_load(tmp / "config.json")
        write_companions(src, tmp, {"weights": f"{HF_WEIGHTS} ({FORMAT}, {dtype} scales and dense tensors)"})
    size = (Path(out) / HF_WEIGHTS).stat().st_size
    return CTReport(Path(out), False, {s: len(v) for s, v in schemes.items()}, size)
