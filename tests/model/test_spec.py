"""The architecture spec against the implementations that must agree with it: megatron's decoder, Hugging
Face's LLaMA, the gguf package's tensor names, and the per-layer shapes of pruned configs."""

import pytest
import torch

from trilm.model import build_model, preset
from trilm.model.layers import QuantColumnParallelLinear, QuantRowParallelLinear
from trilm.model.spec import (
    LINEAR_NAMES,
    LINEARS,
    SITES,
    SUB_BLOCKS,
    canonical_shapes,
    gguf_name,
    hf_name,
    linear_of,
    linears_of,
    parse_key,
    site_groups,
    weight_key,
)


def _pruned():
    return preset("floatlm-nano", vocab_size=300, kv_heads=2, layer_kv_heads=[1, 0], layer_ffn=[96, 64])


def test_block_linears_in_forward_order_and_sites():
    attn, mlp = ("attn.wq", "attn.wk", "attn.wv", "attn.wo"), ("mlp.w_gate", "mlp.w_up", "mlp.w_down")
    assert attn + mlp == LINEAR_NAMES
    assert SITES == ("attn_in", "attn_out", "mlp_in", "mlp_act")
    # GPTQ's true-sequential rounds are the input sites: [q, k, v] → [o] → [gate, up] → [down]
    assert site_groups() == (LINEAR_NAMES[:3], ("attn.wo",), LINEAR_NAMES[4:6], ("mlp.w_down",))
    assert [lin.name for lin in LINEARS if lin.is_output_projection] == ["attn.wo", "mlp.w_down"]
    assert {lin.fed_by for lin in LINEARS if lin.fed_by} == {"attn.wv", "mlp.w_up"}


def test_keys_parse_back():
    assert weight_key(3, "attn.wq") == "layers.3.attn.wq.weight"
    assert parse_key("layers.3.attn.wq.weight") == (3, "attn.wq")
    assert parse_key("embed.weight") is None
    assert linear_of("layers.0.mlp.w_down.weight").parallel == "row"
    assert linear_of("layers.0.attn_norm.weight") is None


def test_per_layer_shapes_drop_removed_sub_blocks():
    cfg = preset("floatlm-nano", vocab_size=300, kv_heads=2, layer_kv_heads=[1, 0], layer_ffn=[96, 0])
    shapes = canonical_shapes(cfg)
    assert shapes["layers.0.attn.wq.weight"] == (2 * cfg.head_dim, cfg.hidden)  # 1 kv head × GQA group 2
    assert shapes["layers.0.attn.wk.weight"] == (cfg.head_dim, cfg.hidden)
    assert shapes["layers.0.mlp.w_down.weight"] == (cfg.hidden, 96)
    assert not any(k.startswith("layers.1.") for k in shapes)  # both sub-blocks removed
    assert [lin.name for lin in linears_of(cfg.layer_shape(1))] == []


def test_spec_matches_megatron_tensor_parallel_styles():
    """The training decoder's column/row-parallel layers hold exactly the spec's column/row linears."""
    model = build_model(_pruned(), tp=1, seed=0)
    assert list(model.canonical_shapes().items()) == list(canonical_shapes(model.cfg).items())
    for module in model.shard_modules():
        for name in module.parts:
            linear = linear_of(name)
            if isinstance(module, QuantRowParallelLinear):
                assert linear.parallel == "row", name
            elif isinstance(module, QuantColumnParallelLinear) and name != "head.weight":
                assert linear.parallel == "column", name


def test_hf_names_and_shapes_are_transformers_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    from trilm.model.hf import hf_config_dict

    cfg = preset("floatlm-nano", vocab_size=256, kv_heads=2)
    hf = LlamaForCausalLM(LlamaConfig(**hf_config_dict(cfg)))
    theirs = {k: tuple(v.shape) for k, v in hf.state_dict().items() if "rotary" not in k}
    ours = {hf_name(k): s for k, s in canonical_shapes(cfg).items()}
    assert ours == theirs


def test_gguf_names_are_llama_cpp_tensor_names():
    import gguf

    arch = gguf.MODEL_ARCH.LLAMA
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch]}
    cfg = _pruned()
    names = [gguf_name(k) for k in canonical_shapes(cfg)]
    assert len(set(names)) == len(names)
    for name in names:
        base = name.removesuffix(".weight")
        template = base.replace(base.split(".")[1], "{bid}", 1) if base.startswith("blk.") else base
        assert template in known, name
    with pytest.raises(KeyError, match="not a canonical tensor name"):
        gguf_name("layers.0.attn.wz.weight")


def test_sub_blocks_own_their_norms_and_linears():
    assert [s.norm for s in SUB_BLOCKS] == ["attn_norm", "mlp_norm"]
    assert sum(len(s.linears) for s in SUB_BLOCKS) == len(LINEARS)
    layer = _pruned().layer_shape(1)
    assert [s.present(layer) for s in SUB_BLOCKS] == [False, True]
    assert torch.Size(linear_of("layers.1.mlp.w_up.weight").shape(_pruned(), layer)) == (64, 64)
