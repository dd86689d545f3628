"""QuantLMs on llama.cpp's Q4_0/Q4_1/Q8_0 grids: the GGUF holds exactly their values (read with gguf)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, quants

from tests.export.conftest import corpus_texts
from trilm.cli import main
from trilm.export.gguf import interleave_rope_rows
from trilm.model.spec import gguf_name, linears_of, weight_key
from trilm.store.open import open_model


def quantize(snap: Path, out: Path, tmp_path: Path, *args: str) -> int:
    calib = tmp_path / "calib.txt"
    calib.write_text("\n\n".join(corpus_texts("train", 40)))
    argv = ["quantize", str(snap), "--out", str(out), "--no-progress", "--calib", str(calib)]
    return main([*argv, "--samples", "8", "--seq-len", "64", *args])


def block_weights(quantlm: Path) -> dict[str, np.ndarray]:
    """gguf tensor name → the QuantLM's dequantized weight in the file's row order (q/k rows interleaved)."""
    src = open_model(quantlm)
    packed = src.weights.packed_layers()
    out = {}
    for i, layer in enumerate(src.config.layer_shapes()):
        for lin in linears_of(layer):
            key = weight_key(i, lin.name)
            w = packed[key.removesuffix(".weight")].dequantize()
            if lin.rope:
                w = interleave_rope_rows(w, layer.heads if lin.out_dim == "q" else layer.kv_heads)
            out[gguf_name(key)] = w.numpy()
    return out


@pytest.mark.parametrize(
    "method,qtype,extra",
    [
        ("rtn", "q4_0", ()),
        ("gptq", "q4_0", ("--act-order", "--static-groups")),
        ("gptq", "q4_1", ()),
        ("gptq", "q8_0", ()),
    ],
)
def test_quantlm_on_a_llama_cpp_grid_is_written_exactly(make_snapshot, tmp_path, method, qtype, extra):
    snap = make_snapshot("floatlm", seed=3)
    quantlm = tmp_path / "q"
    assert quantize(snap, quantlm, tmp_path, "--method", method, "--target", f"gguf-{qtype}", *extra) == 0
    out = tmp_path / "m.gguf"
    assert main(["export", "gguf", str(quantlm), str(out)]) == 0  # the QuantLM's own type by default
    tensors = {t.name: t for t in GGUFReader(out).tensors}
    want = block_weights(quantlm)
    assert want and set(want) <= set(tensors)
    for name, w in want.items():
        t = tensors[name]
        assert t.tensor_type == GGMLQuantizationType[qtype.upper()], name
        got = quants.dequantize(t.data, t.tensor_type).reshape(w.shape)
        assert np.array_equal(got.view(np.uint32), w.view(np.uint32)), name
    bytes_per_block = {"q4_0": 18, "q4_1": 20, "q8_0": 34}[qtype]
    assert all(tensors[n].n_bytes == w.size // 32 * bytes_per_block for n, w in want.items())


def test_a_quantlm_off_the_grid_is_refused_by_layer(make_snapshot, tmp_path, capsys):
    snap = make_snapshot("floatlm", seed=4)
    quantlm = tmp_path / "q"
    assert quantize(snap, quantlm, tmp_path, "--method", "rtn", "--bits", "4", "--group-size", "64") == 0
    out = tmp_path / "m.gguf"
    assert main(["export", "gguf", str(quantlm), str(out), "--type", "q4_0"]) == 2
    err = capsys.readouterr().err
    assert "blk.0.attn_k.weight" in err and "group size 64" in err and "--target gguf-q4_0" in err
    assert not out.exists()


def test_a_float_model_gets_llama_cpp_rounding(make_snapshot, tmp_path):
    snap = make_snapshot("floatlm", seed=5)
    out = tmp_path / "m.gguf"
    assert main(["export", "gguf", str(snap), str(out), "--type", "q4_1"]) == 0
    kinds = {t.name: t.tensor_type for t in GGUFReader(out).tensors}
    assert kinds["blk.0.ffn_down.weight"] == GGMLQuantizationType.Q4_1
