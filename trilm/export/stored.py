"""What an exported file stores: bytes, bits per block-linear weight (scales and zero points included, by
:func:`trilm.bits.stored_linear_bits`), and whether a GGUF file holds a QuantLM's weights exactly.

Read from the files themselves (``gguf.GGUFReader``, ``safetensors``), not from what the exporter meant to
write, so a runtime's row and the file it read describe the same bytes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from safetensors import safe_open

from trilm.bits import stored_linear_bits
from trilm.export.gguf import interleave_rope_rows
from trilm.export.hf import float_state
from trilm.model.spec import gguf_name, linears_of, weight_key
from trilm.store import open_model


@dataclasses.dataclass
class StoredTensor:
    """A block linear as a file stores it, for :func:`trilm.bits.stored_linear_bits` (the one definition
    of stored bits per weight) when the layer is not a trilm ``PackedWeight``: bytes of everything it
    keeps (codes, scales, zero points, mins) over N·K."""

    bits: int
    out_features: int
    in_features: int

    def storage_bits(self) -> int:
        return self.bits


BLOCK_LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def gguf_bits(path: Path) -> dict:
    """Bits per block-linear weight of a GGUF file, and the type of each kind of tensor."""
    from gguf import GGUFReader  # deferred for start-up time: loads gguf only when called

    reader = GGUFReader(path)
    linears: list[StoredTensor] = []
    types: dict[str, str] = {}
    for t in reader.tensors:
        kind = t.name.split(".")[-2] if t.name.startswith("blk.") else t.name.removesuffix(".weight")
        types.setdefault(kind, t.tensor_type.name)
        if t.name.startswith("blk.") and kind in BLOCK_LINEARS:
            k, n = (int(x) for x in t.shape[:2])  # gguf lists ne0 (the row length) first
            linears.append(StoredTensor(int(t.n_bytes) * 8, n, k))
    return {"linear_bits": stored_linear_bits(linears), "types": types}


def ctensors_bits(directory: Path) -> float:
    """Bits per block-linear weight of a compressed-tensors directory (packed codes, scales, zero points)."""

    layers = []
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            names = set(f.keys())
            for name in names:
                if not name.endswith(".weight_packed"):
                    continue
                prefix = name.removesuffix("weight_packed")
                parts = [f.get_tensor(p) for p in names if p.startswith(prefix) and p != prefix + "weight"]
                n, k = (int(x) for x in f.get_tensor(prefix + "weight_shape"))
                layers.append(StoredTensor(sum(t.numel() * t.element_size() * 8 for t in parts), n, k))
    return stored_linear_bits(layers)


def weight_bytes(path: Path) -> int:
    """Bytes of the file(s) holding the weights: a GGUF file, or a directory's ``*.safetensors``."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.glob("*.safetensors"))


def quantlm_bits(path: Path) -> float:

    packed = open_model(path, verify=False).weights.packed_layers()
    return stored_linear_bits(packed) if packed else 32.0


def gguf_matches_quantlm(gguf: Path, quantlm: Path) -> dict:
    """Every block linear of ``gguf``, dequantized by the ``gguf`` package, against the QuantLM's weight
    (q/k rows in llama.cpp's interleaved RoPE order): bit for bit, or the worst difference."""
    from gguf import GGUFReader, quants  # deferred for start-up time: loads gguf only when called

    src = open_model(quantlm, verify=False)
    state = float_state(src)
    tensors = {t.name: t for t in GGUFReader(gguf).tensors}
    checked, equal, worst = 0, 0, 0.0
    for i, layer in enumerate(src.config.layer_shapes()):
        for lin in linears_of(layer):
            key = weight_key(i, lin.name)
            want = state[key].float()
            if lin.rope:
                want = interleave_rope_rows(want, layer.heads if lin.out_dim == "q" else layer.kv_heads)
            t = tensors[gguf_name(key)]
            got = quants.dequantize(t.data, t.tensor_type).reshape(want.shape).astype(np.float32)
            want_np = want.numpy().astype(np.float32)
            checked += 1
            equal += bool(np.array_equal(got.view(np.uint32), want_np.view(np.uint32)))
            worst = max(worst, float(np.abs(got - want_np).max()))
    return {"tensors": checked, "bit_for_bit": equal, "max_abs_diff": worst}
