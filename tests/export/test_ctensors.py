"""``trilm export compressed-tensors``: transformers loads the QuantLM quantized and computes its logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tests.export.test_gguf_blocks import quantize
from trilm.cli import main
from trilm.store.open import open_model

pytest.importorskip("compressed_tensors", reason="compressed-tensors is not installed (pip install .[dev])")
pytest.importorskip("transformers", reason="transformers is not installed")

IDS = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(0))


def hf_logits(directory: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(IDS).logits


def trilm_logits(quantlm: Path) -> torch.Tensor:
    from trilm.infer import load_inference_model

    model = load_inference_model(quantlm).eval()
    with torch.no_grad():
        return model(IDS).float()


@pytest.mark.parametrize(
    "args,scheme",
    [
        (("--method", "rtn", "--bits", "4", "--group-size", "32", "--sym"), (4, 32)),
        (("--method", "gptq", "--bits", "8", "--sym"), (8, None)),
        (
            (
                "--method",
                "gptq",
                "--bits",
                "3",
                "--group-size",
                "32",
                "--sym",
                "--act-order",
                "--static-groups",
            ),
            (3, 32),
        ),
        (("--method", "rtn", "--bits", "2", "--group-size", "64", "--sym"), (2, 64)),
        (("--method", "gptq", "--target", "gguf-q4_0"), (4, 32)),
    ],
)
def test_transformers_runs_the_quantlm_quantized(make_snapshot, tmp_path, args, scheme):
    quantlm, out = tmp_path / "q", tmp_path / "ct"
    assert quantize(make_snapshot("floatlm", seed=6), quantlm, tmp_path, *args) == 0
    assert main(["export", "compressed-tensors", str(quantlm), str(out)]) == 0
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["format"] == "pack-quantized" and config["ignore"] == ["lm_head"]
    groups = list(config["config_groups"].values())
    # one scheme covers each of these models (W2 g64: the K = 64 layers' one group per row is a group of 64)
    (group,) = groups
    assert group["targets"] == ["Linear"] and "dequantize" not in config
    weights = group["weights"]
    assert (weights["num_bits"], weights["group_size"], weights["symmetric"]) == (*scheme, True)
    assert weights["strategy"] == ("channel" if scheme[1] is None else "group")
    with safe_open(out / "model.safetensors", "pt") as f:
        names = set(f.keys())
        packed = f.get_tensor("model.layers.0.mlp.down_proj.weight_packed")
    suffixes = {"weight_packed", "weight_scale", "weight_shape"}
    assert {f"model.layers.0.self_attn.q_proj.{s}" for s in suffixes} <= names
    assert "model.layers.0.self_attn.q_proj.weight" not in names and "lm_head.weight" in names
    down = open_model(quantlm).weights.packed_layers()["layers.0.mlp.w_down"]
    assert (
        packed.dtype == torch.int32
        and packed.numel() * 32 == down.in_features * down.out_features * scheme[0]
    )
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    # in fp32 the quantized checkpoint computes bit for bit what the dense export of the dequantized QuantLM
    # does, and both what trilm computes (up to fp32 summation order); fp16 rounds embeddings and norms
    exact = tmp_path / "ct32"
    assert main(["export", "compressed-tensors", str(quantlm), str(exact), "--dtype", "float32"]) == 0
    assert main(["export", "hf", str(quantlm), str(tmp_path / "dense"), "--dtype", "float32"]) == 0
    ours = hf_logits(exact)
    assert torch.equal(ours, hf_logits(tmp_path / "dense"))
    torch.testing.assert_close(ours, trilm_logits(quantlm), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hf_logits(out), ours, rtol=0, atol=2e-3)


def scheme_args(method: str, bits: int, group: int, sym: bool, *extra: str) -> tuple[str, ...]:
    return (
        "--method",
        method,
        "--bits",
        str(bits),
        "--group-size",
        str(group),
        *(("--sym",) if sym else ()),
        *extra,
    )


# Every scheme the export writes: 2/3/4/8 bits, symmetric and asymmetric, per-channel and grouped; then a
# group that is the whole row of some layers (one scheme), mixed group sizes (symmetric: one config group
# per size), widths that are not multiples of 32 (packing pads the last int32 word along K and N), and the
# GPTQ W4 g32 asymmetric QuantLM of the report this test answers.
EVERY_SCHEME = [
    pytest.param(
        "rtn",
        bits,
        group,
        sym,
        (),
        {},
        id=f"rtn-w{bits}-{'ch' if group < 0 else f'g{group}'}-{'sym' if sym else 'asym'}",
    )
    for bits in (2, 3, 4, 8)
    for group in (-1, 32)
    for sym in (True, False)
] + [
    pytest.param("rtn", 4, 64, False, (), {}, id="rtn-w4-g64-asym-whole-row"),
    pytest.param("rtn", 3, 48, True, ("--group-fit", "nearest"), {}, id="rtn-w3-g48-nearest-sym-mixed"),
    pytest.param("rtn", 3, 8, False, (), {"ffn": 200}, id="rtn-w3-g8-asym-ffn200"),
    pytest.param("rtn", 2, -1, True, (), {"ffn": 200}, id="rtn-w2-ch-sym-ffn200"),
    pytest.param("gptq", 4, 32, False, (), {}, id="gptq-w4-g32-asym"),
]


@pytest.mark.parametrize("method,bits,group,sym,extra,overrides", EVERY_SCHEME)
def test_every_scheme_loads_through_from_pretrained(
    make_snapshot, tmp_path, capsys, method, bits, group, sym, extra, overrides
):
    """transformers' ``AutoModelForCausalLM.from_pretrained`` loads each scheme and computes trilm's logits.

    In fp32 the checkpoint's dequantized weights are the QuantLM's numbers, so its logits equal bit for bit
    those of the dense fp32 export through the same transformers code, and differ from trilm's only by
    float summation order: a few fp32 ulps (2^-24 relative) per term of K ≤ 200-term dot products through
    two blocks, well inside 1e-5 on logits of order 1-10. The default fp16 export rounds the embedding and
    norms to fp16 (relative 2^-11), which 2e-3 absolute covers.
    """
    quantlm, exact, dense, half = (tmp_path / d for d in ("q", "ct32", "dense", "ct16"))
    source = make_snapshot("floatlm", seed=9, **overrides)
    assert quantize(source, quantlm, tmp_path, *scheme_args(method, bits, group, sym, *extra)) == 0
    capsys.readouterr()
    assert main(["export", "compressed-tensors", str(quantlm), str(exact), "--dtype", "float32"]) == 0
    said = capsys.readouterr().out
    assert "from_pretrained loads it" in said and "vLLM" not in said, said
    assert ("dequantizing the weights as they load" in said) == (not sym), said
    config = json.loads((exact / "config.json").read_text())["quantization_config"]
    assert config.get("dequantize", False) == (not sym)
    groups = [g["weights"] for g in config["config_groups"].values()]
    assert {(w["num_bits"], w["symmetric"]) for w in groups} == {(bits, sym)}
    assert {w["strategy"] for w in groups} == ({"channel"} if group < 0 else {"group"})
    assert (len(groups) > 1) == ("nearest" in extra)
    assert main(["export", "hf", str(quantlm), str(dense), "--dtype", "float32"]) == 0
    assert main(["export", "compressed-tensors", str(quantlm), str(half)]) == 0
    ours = hf_logits(exact)
    assert torch.equal(ours, hf_logits(dense))
    reference = trilm_logits(quantlm)
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hf_logits(half), ours, rtol=0, atol=2e-3)


def test_asymmetric_zero_points_are_packed_as_llmcompressor_packs_them(make_snapshot, tmp_path):
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme

    quantlm, out = tmp_path / "q", tmp_path / "ct"
    assert (
        quantize(make_snapshot("floatlm", seed=7), quantlm, tmp_path, "--method", "rtn", "--bits", "4") == 0
    )
    assert main(["export", "compressed-tensors", str(quantlm), str(out), "--dtype", "float32"]) == 0
    (group,) = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"].values()
    scheme = QuantizationScheme.model_validate(group)
    assert not scheme.weights.symmetric
    packed = open_model(quantlm).weights.packed_layers()
    with safe_open(out / "model.safetensors", "pt") as f:
        for key, weight in packed.items():
            module = {"layers.0.attn.wq": "model.layers.0.self_attn.q_proj"}.get(key)
            if module is None:
                continue
            state = {
                s: f.get_tensor(f"{module}.{s}") for s in ("weight_packed", "weight_scale", "weight_shape")
            }
            state["weight_zero_point"] = f.get_tensor(f"{module}.weight_zero_point")
            dense = PackedQuantizationCompressor.decompress(state, scheme)["weight"]
            assert torch.equal(dense, weight.dequantize())


@pytest.mark.parametrize(
    "family,args,match",
    [
        ("trilm", None, "a trilm model"),
        ("floatlm", None, "nothing is quantized"),
        (
            "floatlm",
            ("--method", "gptq", "--bits", "4", "--group-size", "32", "--act-order"),
            "act-order g_idx",
        ),
        ("floatlm", ("--method", "gptq", "--target", "gguf-q4_1"), "float mins"),
        ("floatlm", ("--method", "pbllm"), "pbllm stores it as"),
        (
            "floatlm",
            ("--method", "rtn", "--bits", "4", "--group-size", "48", "--group-fit", "nearest"),
            "asymmetric layers with different schemes",
        ),
        ("floatlm", ("--method", "billm"), "billm stores it as"),
    ],
)
def test_what_the_format_cannot_hold_is_refused_by_name(make_snapshot, tmp_path, capsys, family, args, match):
    source = make_snapshot(family, seed=8)
    if args is not None:
        assert quantize(source, tmp_path / "q", tmp_path, *args) == 0
        source = tmp_path / "q"
    out = tmp_path / "ct"
    capsys.readouterr()
    assert main(["export", "compressed-tensors", str(source), str(out)]) == 2
    err = capsys.readouterr().err
    assert "compressed-tensors cannot hold this model" in err and match in err, err
    assert not out.exists()
    assert main(["export", "compressed-tensors", str(source), str(out), "--dequantized"]) == 0
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
