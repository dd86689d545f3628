"""GGUF export: read back with gguf's reader, logits of a llama.cpp-convention forward pass, refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, GGUFReader, quants

from trilm.cli import main
from trilm.config import ConfigError
from trilm.export.gguf import export_snapshot_gguf
from trilm.train.models import load_model

WIDE = dict(hidden=256, ffn=768, heads=4, kv_heads=2, layers=2, context=64)


def _tensors(path):
    reader = GGUFReader(path)
    out = {}
    for t in reader.tensors:
        shape = [int(x) for x in reversed(t.shape.tolist())]
        out[t.name] = torch.from_numpy(quants.dequantize(t.data, t.tensor_type).reshape(shape).copy())
    fields = {
        name: f.contents() for name, f in reader.fields.items() if not name.startswith("tokenizer.ggml.t")
    }
    return reader, out, fields


def _llama_cpp_logits(path, ids: torch.Tensor) -> torch.Tensor:
    """A forward pass with llama.cpp's conventions (interleaved RoPE pairs), sized by the file's metadata:
    scalars (llama) or one entry per block (deci: 0 heads = no attention in that block)."""
    _, w, kv = _tensors(path)
    arch = kv["general.architecture"]
    blocks = kv[f"{arch}.block_count"]

    def per_block(key):
        value = kv[f"{arch}.{key}"]
        return value if isinstance(value, list) else [value] * blocks

    heads, kv_heads = per_block("attention.head_count"), per_block("attention.head_count_kv")
    ffn = per_block("feed_forward_length")
    eps, base = kv[f"{arch}.attention.layer_norm_rms_epsilon"], kv[f"{arch}.rope.freq_base"]
    x = w["token_embd.weight"][ids]
    s, d = x.shape[-2], x.shape[-1]
    hd = kv.get(f"{arch}.attention.key_length") or d // heads[0]
    freqs = base ** (-torch.arange(0, hd, 2).float() / hd)
    angle = torch.arange(s).float()[:, None] * freqs[None, :]
    cos, sin = angle.cos(), angle.sin()

    def rope(t):  # t (b, s, h, hd): rotate pairs (2j, 2j + 1)
        a, b = t[..., 0::2], t[..., 1::2]
        c, n = cos[None, :, None, :], sin[None, :, None, :]
        return torch.stack([a * c - b * n, a * n + b * c], dim=-1).flatten(-2)

    def norm(t, g):
        return F.rms_norm(t, (d,), eps=eps) * g

    for i in range(blocks):
        p = f"blk.{i}."
        if heads[i]:
            h = norm(x, w[p + "attn_norm.weight"])
            q = rope((h @ w[p + "attn_q.weight"].T).view(*h.shape[:2], heads[i], hd)).transpose(1, 2)
            k = rope((h @ w[p + "attn_k.weight"].T).view(*h.shape[:2], kv_heads[i], hd)).transpose(1, 2)
            v = (h @ w[p + "attn_v.weight"].T).view(*h.shape[:2], kv_heads[i], hd).transpose(1, 2)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + att.transpose(1, 2).reshape(*h.shape[:2], -1) @ w[p + "attn_output.weight"].T
        if ffn[i]:
            h = norm(x, w[p + "ffn_norm.weight"])
            gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
            x = x + (F.silu(gate) * up) @ w[p + "ffn_down.weight"].T
    return norm(x, w["output_norm.weight"]) @ w["output.weight"].T


def _ids():
    return torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("qtype", ["tq2_0", "tq1_0"])
def test_trilm_tq_is_exact_with_tp_partition_scales_folded(make_snapshot, tmp_path, qtype):
    snap = make_snapshot("trilm", seed=3, quant={"partitions": 2}, **WIDE)
    out = tmp_path / f"m-{qtype}.gguf"
    report = export_snapshot_gguf(snap, out, qtype=qtype)
    # o_proj: 256 columns in 2 partitions of 128 straddle a block; down_proj: 768 in 2 × 384 as well
    names = ("attn_output", "ffn_down")
    assert report.folded == [f"blk.{i}.{n}.weight" for i in range(2) for n in names]
    reader, w, kv = _tensors(out)
    want_type = GGMLQuantizationType[qtype.upper()]
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert all(
        types[n] == want_type for n in w if n.startswith("blk.") and n.endswith(("q.weight", "down.weight"))
    )
    assert types["token_embd.weight"] == GGMLQuantizationType.F16
    assert types["blk.0.attn_norm.weight"] == GGMLQuantizationType.F32
    assert kv["general.file_type"] == (36 if qtype == "tq1_0" else 37)
    assert kv["tokenizer.ggml.add_bos_token"] is False and kv["tokenizer.ggml.model"] == "llama"
    assert kv["tokenizer.ggml.eos_token_id"] == 2 and kv["llama.vocab_size"] == 512
    for name, tensor in w.items():  # at most one non-zero magnitude per 256-block: ternary, exactly
        if name.startswith("blk.") and tensor.dim() == 2:
            blocks = tensor.abs().reshape(tensor.shape[0], -1, 256)
            assert ((blocks == 0) | (blocks == blocks.amax(-1, keepdim=True))).all(), name
    model = load_model(snap, tp=1).eval()
    with torch.no_grad():
        ours = model(_ids())
    theirs = _llama_cpp_logits(out, _ids())
    assert (ours - theirs).abs().max() < 2e-3 * ours.abs().max()


def test_floatlm_f16_and_q8_0_read_back_and_reproduce_logits(make_snapshot, tmp_path, capsys):
    snap = make_snapshot("floatlm", seed=4, **WIDE)
    model = load_model(snap, tp=1).eval()
    with torch.no_grad():
        ours = model(_ids())
    assert main(["export", "gguf", str(snap), str(tmp_path / "f16.gguf")]) == 0
    assert "read back with gguf" in capsys.readouterr().out
    assert (ours - _llama_cpp_logits(tmp_path / "f16.gguf", _ids())).abs().max() < 1e-2
    export_snapshot_gguf(snap, tmp_path / "q8.gguf", qtype="q8_0")
    _, _, kv = _tensors(tmp_path / "q8.gguf")
    assert kv["general.file_type"] == 7
    q8 = _llama_cpp_logits(tmp_path / "q8.gguf", _ids())
    assert (ours - q8).abs().max() < 5e-2 and not torch.equal(ours, q8)


def test_refusals_name_the_tensor_and_never_fall_back(make_snapshot, tmp_path):
    narrow = make_snapshot("trilm", run="narrow")  # hidden 64: rows of 64 weights
    with pytest.raises(
        ConfigError, match=r"blk\.0\.attn_q\.weight has rows of 64 weights, not a multiple of 256"
    ):
        export_snapshot_gguf(narrow, tmp_path / "n.gguf", qtype="tq1_0")
    assert not (tmp_path / "n.gguf").exists()
    assert export_snapshot_gguf(narrow, tmp_path / "n.gguf", qtype="f16").qtype == "f16"
    grouped = make_snapshot("trilm", run="grouped", quant={"scale_group": "group:128"}, **WIDE)
    with pytest.raises(
        ConfigError, match=r"blk\.0\.attn_q\.weight: its 256-weight blocks hold more than one"
    ):
        export_snapshot_gguf(grouped, tmp_path / "g.gguf", qtype="tq2_0")
    floatlm = make_snapshot("floatlm", run="float", **WIDE)
    with pytest.raises(ConfigError, match="a FloatLM is not ternary"):
        export_snapshot_gguf(floatlm, tmp_path / "f.gguf", qtype="tq2_0")
    with pytest.raises(ConfigError, match="holds another export"):
        export_snapshot_gguf(floatlm, tmp_path / "n.gguf", qtype="f16")
    assert not list(tmp_path.glob(".tmp-*"))


def test_bilm_tq2_0_is_exact(make_snapshot, tmp_path):
    snap = make_snapshot("bilm", seed=1, **WIDE)
    export_snapshot_gguf(snap, tmp_path / "b.gguf", qtype="tq2_0")
    _, w, _ = _tensors(tmp_path / "b.gguf")
    q = w["blk.0.attn_q.weight"]
    assert set(torch.unique(q.abs()).tolist()) == {float(np.float16(q.abs().max()))}


def test_spectra_1_1b_o_proj_blocks_straddle_shards_and_are_folded_exactly():
    """Spectra-1.1B at its training TP=2: o_proj has 2 × 896 columns; 896 is not a multiple of 256."""
    from pathlib import Path
    from types import SimpleNamespace

    from trilm.export.gguf import single_magnitude_blocks, ternary_tensors
    from trilm.model import preset
    from trilm.model.hf import dequantized_state_dict
    from trilm.model.spec import canonical_shapes

    cfg = preset(
        "trilm-1.1b", layers=1, ffn=512, vocab_size=512, quant={"partitions": 2}
    )  # o_proj as in 1.1B
    gen = torch.Generator().manual_seed(0)
    latent = {k: torch.randn(s, generator=gen) * 0.02 for k, s in canonical_shapes(cfg).items()}
    state = dequantized_state_dict(cfg, latent)
    wo, wv = state["layers.0.attn.wo.weight"], state["layers.0.attn.wv.weight"]
    assert not single_magnitude_blocks(wo) and single_magnitude_blocks(state["layers.0.mlp.w_down.weight"])
    out, folded, left = ternary_tensors(SimpleNamespace(config=cfg, path=Path("1.1b")), state, "tq1_0")
    assert folded == ["blk.0.attn_output.weight"] and left == []
    wo2, wv2 = out["layers.0.attn.wo.weight"], out["layers.0.attn.wv.weight"]
    assert single_magnitude_blocks(wo2) and single_magnitude_blocks(wv2)
    assert torch.equal(torch.sign(wo2), torch.sign(wo)) and torch.equal(torch.sign(wv2), torch.sign(wv))
    # the same function: o_proj(v) over any mixing of positions, per head dimension
    x = torch.randn(5, cfg.hidden, generator=gen, dtype=torch.float64)
    mix = torch.softmax(torch.randn(5, 5, generator=gen, dtype=torch.float64), -1)
    ref = (mix @ (x @ wv.double().T)) @ wo.double().T
    new = (mix @ (x @ wv2.double().T)) @ wo2.double().T
    assert (ref - new).abs().max() <= 1e-5 * ref.abs().max(), float((ref - new).abs().max() / ref.abs().max())


# -- per-layer shapes (structurally pruned models) -----------------------------------------------------
@pytest.mark.parametrize(
    "shapes",
    [
        dict(
            layer_kv_heads=[2, 1], layer_ffn=[180, 89]
        ),  # the channel-pruned FloatLM-nano, and heads
        dict(layer_kv_heads=[0, 2], layer_ffn=[192, 64]),  # block 0 lost its attention
    ],
)
def test_pruned_floatlm_declares_its_per_layer_shapes_and_computes_its_logits(
    make_snapshot, tmp_path, shapes
):
    from trilm.export.gguf_read import check_declared_shapes

    snap = make_snapshot("floatlm", seed=5, kv_heads=2, **shapes)
    model = load_model(snap, tp=1).eval()
    out = tmp_path / "pruned.gguf"
    report = export_snapshot_gguf(snap, out, qtype="f16")
    assert report.blocks == 2
    _, _, kv = _tensors(out)
    assert kv["general.architecture"] == "deci"
    assert kv["deci.feed_forward_length"] == shapes["layer_ffn"]
    assert kv["deci.attention.head_count_kv"] == shapes["layer_kv_heads"]
    assert kv["deci.attention.head_count"] == [2 * k for k in shapes["layer_kv_heads"]]
    assert kv["deci.attention.key_length"] == model.cfg.head_dim
    declared = check_declared_shapes(out)  # gguf's reader: every tensor has the shape the metadata says
    assert declared.layer_shapes() == model.cfg.layer_shapes()
    with torch.no_grad():
        ours = model(_ids())
    assert (ours - _llama_cpp_logits(out, _ids())).abs().max() < 1e-2


def test_empty_blocks_are_left_out_and_ffn_free_attention_is_refused(make_snapshot, tmp_path):
    snap = make_snapshot(
        "floatlm", seed=6, run="empty", layers=3, layer_kv_heads=[4, 0, 4], layer_ffn=[192, 0, 96]
    )
    out = tmp_path / "e.gguf"
    report = export_snapshot_gguf(snap, out, qtype="f16")
    _, _, kv = _tensors(out)
    assert report.blocks == kv["deci.block_count"] == 2 and kv["trilm.blocks"] == [0, 2]
    with torch.no_grad():
        ours = load_model(snap, tp=1).eval()(_ids())
    assert (ours - _llama_cpp_logits(out, _ids())).abs().max() < 1e-2
    attention_only = make_snapshot("floatlm", run="attn-only", layer_kv_heads=[4, 4], layer_ffn=[192, 0])
    with pytest.raises(ConfigError, match="block 1 keeps its attention but has no MLP.*drops the attention"):
        export_snapshot_gguf(attention_only, tmp_path / "a.gguf", qtype="f16")
    assert not (tmp_path / "a.gguf").exists()


def test_a_file_whose_metadata_disagrees_with_its_tensors_is_named(make_snapshot, tmp_path):
    """A file without per-layer metadata: llama.feed_forward_length = 192 over FFN tensors of 180 and 89
    rows, which no reader can load as written. The read-back check names the tensors."""
    import gguf

    from trilm.export.gguf_read import check_declared_shapes

    path = tmp_path / "wrong.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(192)
    writer.add_head_count(4)
    writer.add_head_count_kv(4)
    writer.add_vocab_size(8)
    tensors = {"token_embd.weight": (8, 64), "output_norm.weight": (64,), "output.weight": (8, 64)}
    tensors.update({f"blk.0.{n}.weight": (64,) for n in ("attn_norm", "ffn_norm")})
    tensors.update({f"blk.0.attn_{n}.weight": (64, 64) for n in ("q", "k", "v", "output")})
    tensors.update({"blk.0.ffn_gate.weight": (180, 64), "blk.0.ffn_up.weight": (180, 64)})
    tensors["blk.0.ffn_down.weight"] = (64, 180)
    for name, shape in tensors.items():
        writer.add_tensor(name, np.zeros(shape, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(
        ConfigError, match=r"blk\.0\.ffn_gate\.weight \(180, 64\) where the metadata says \(192, 64\)"
    ):
        check_declared_shapes(path)


def test_llama_cpp_loads_a_pruned_export_and_computes_trilms_logits(make_snapshot, tmp_path):
    """The real reader: llama.cpp (llama-cpp-python, the benchmark extra) loads the deci file of a model with
    per-block head counts, FFN widths and an attention-free block, and gives trilm's logits within F16."""
    llama_cpp = pytest.importorskip("llama_cpp")
    snap = make_snapshot("floatlm", seed=7, run="llama-cpp", kv_heads=2, layers=3)
    pruned = make_snapshot(
        "floatlm", seed=7, run="llama-cpp-pruned", kv_heads=2, layers=3, layer_kv_heads=[2, 0, 1],
        layer_ffn=[180, 89, 192],
    )  # fmt: skip
    ids = _ids()[0].tolist()
    for source in (snap, pruned):
        out = tmp_path / f"{source.parent.parent.name}.gguf"
        export_snapshot_gguf(source, out, qtype="f16")
        llm = llama_cpp.Llama(model_path=str(out), n_ctx=64, logits_all=True, verbose=False, n_threads=1)
        llm.eval(ids)
        theirs = torch.tensor(np.array(llm.scores[: len(ids)]))
        with torch.no_grad():
            ours = load_model(source, tp=1).eval()(torch.tensor([ids]))[0]
        assert (ours - theirs).abs().max() < 1e-2 * max(1.0, float(ours.abs().max())), source


@pytest.mark.parametrize("fallback", ["f16", "q8_0"])
def test_fallback_writes_the_tensors_tq_blocks_cannot_hold_in_the_named_type(
    make_snapshot, tmp_path, fallback
):
    """Rows of 64 (hidden) cannot be TQ2_0 blocks; rows of 256 (the FFN width, down_proj's input) can. With
    ``--fallback`` the first go in the named type, listed in the file and the report, the rest stay TQ2_0,
    and the file still computes the model: F16 holds a ternary tensor as TQ would (codes × fp16 scale)."""
    snap = make_snapshot("trilm", seed=3, run=f"fb-{fallback}", ffn=256)
    out = tmp_path / f"{fallback}.gguf"
    assert main(["export", "gguf", str(snap), str(out), "--type", "tq2_0", "--fallback", fallback]) == 0
    reader, w, kv = _tensors(out)
    types = {t.name: t.tensor_type for t in reader.tensors}
    other = GGMLQuantizationType[fallback.upper()]
    linears = [n for n in types if n.startswith("blk.") and n.endswith("weight") and w[n].dim() == 2]
    assert {n for n in linears if types[n] == GGMLQuantizationType.TQ2_0} == {
        "blk.0.ffn_down.weight",
        "blk.1.ffn_down.weight",
    }
    moved = sorted(n for n in linears if "ffn_down" not in n)
    assert all(types[n] == other for n in moved) and sorted(kv["trilm.fallback_tensors"]) == moved
    assert kv["general.file_type"] == 37
    model = load_model(snap, tp=1).eval()
    with torch.no_grad():
        ours = model(_ids())
    bound = 2e-3 if fallback == "f16" else 2e-2
    assert (ours - _llama_cpp_logits(out, _ids())).abs().max() < bound * ours.abs().max()
    if fallback == "f16":
        q = w["blk.0.attn_q.weight"]
        assert len(set(torch.unique(q.abs()).tolist()) - {0.0}) == 1


def test_fallback_is_refused_where_it_means_nothing(make_snapshot, tmp_path):
    snap = make_snapshot("trilm", run="fb-refused")
    with pytest.raises(ConfigError, match="only a tq1_0/tq2_0 export"):
        export_snapshot_gguf(snap, tmp_path / "x.gguf", qtype="f16", fallback="q8_0")
    with pytest.raises(ConfigError, match=r"--fallback 'q4_0': choose one of f16, q8_0"):
        export_snapshot_gguf(snap, tmp_path / "x.gguf", qtype="tq2_0", fallback="q4_0")
    assert not list(tmp_path.glob("*.gguf"))


def test_llama_cpp_runs_a_tq2_0_file_with_fallback_tensors(make_snapshot, tmp_path):
    """The real reader on the mixed file a model with 576-wide rows (SmolLM2) needs: TQ2_0 where rows are
    multiples of 256, F16 elsewhere; llama.cpp's logits equal trilm's within fp16 rounding."""
    llama_cpp = pytest.importorskip("llama_cpp")
    snap = make_snapshot("trilm", seed=5, run="fb-llama-cpp", ffn=256)
    out = tmp_path / "mixed.gguf"
    export_snapshot_gguf(snap, out, qtype="tq2_0", fallback="f16")
    ids = _ids()[0].tolist()
    llm = llama_cpp.Llama(model_path=str(out), n_ctx=64, logits_all=True, verbose=False, n_threads=1)
    llm.eval(ids)
    theirs = torch.tensor(np.array(llm.scores[: len(ids)]))
    with torch.no_grad():
        ours = load_model(snap, tp=1).eval()(torch.tensor([ids]))[0]
    assert (ours - theirs).abs().max() < 1e-2 * max(1.0, float(ours.abs().max()))
