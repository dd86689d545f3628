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
    down = "model.layers.0.mlp.down_proj"
    if len(groups) > 1:  # group 64 is the whole row of the K = 64 layers: those are per-channel
        assert sorted(len(g["targets"]) for g in groups) == [2, 12]
    weights = next(g["weights"] for g in groups if down in g["targets"] or g["targets"] == ["Linear"])
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
