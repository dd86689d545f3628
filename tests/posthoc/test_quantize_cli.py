"""``trilm quantize`` end to end: a QuantLM that loads, evaluates and runs through QuantLinear; bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from trilm.cli import main
from trilm.store.hf import write_hf_files
from trilm.store.open import open_model
from trilm.store.snapshot import read_snapshot_config


def quantize(snapshot: Path, data: dict, out: Path, *extra: str, samples: int = 8) -> int:
    argv = ["quantize", str(snapshot), "--calib", str(data["train"]), "--samples", str(samples)]
    argv += ["--seq-len", "64", "--out", str(out), "--no-progress", *extra]
    return main(argv)


def leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


@pytest.fixture(scope="module")
def gptq_quantlm(float_snapshot, embedded_data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("quantlm") / "gptq-w4g64"
    args = ("--method", "gptq", "--bits", "4", "--group-size", "64", "--act-order", "--true-sequential")
    args += ("--eval", str(embedded_data["validation"]), "--eval-sequences", "4")
    assert quantize(float_snapshot, embedded_data, out, *args) == 0
    return out


def test_quantlm_layout_and_metadata(gptq_quantlm, float_snapshot):
    names = sorted(p.name for p in gptq_quantlm.iterdir())
    assert names == ["COMPLETE", "config.json", "model.safetensors", "packed.safetensors", "tokenizer.model"]
    assert (gptq_quantlm / "tokenizer.model").read_bytes() == (
        float_snapshot / "tokenizer.model"
    ).read_bytes()
    _, meta = read_snapshot_config(gptq_quantlm)
    quant = meta.extra["quant"]
    assert quant["method"] == "gptq" and quant["source"] == str(float_snapshot.resolve())
    assert quant["options"]["act_order"] and quant["options"]["true_sequential"]
    assert quant["bits"]["paper"] == pytest.approx(4 + 20 / 64)
    packed = open_model(gptq_quantlm).weights.packed_layers()
    stored = sum(p.storage_bits() for p in packed.values()) / sum(
        p.in_features * p.out_features for p in packed.values()
    )
    assert quant["bits"]["stored"] == pytest.approx(stored)
    assert quant["calibration"]["samples"] == 8 and quant["calibration"]["seed"] == 0
    assert quant["calibration_data"]["seq_len"] == 64
    assert quant["seconds"]["total"] > 0 and quant["memory"]["working_set_bytes"] > 0
    assert all(p.g_idx is not None for p in packed.values())
    assert meta.val_loss == quant["eval"]["val_loss"]
    json.dumps(meta.to_dict())


def test_quantlm_loads_and_evaluates(gptq_quantlm, embedded_data):
    from trilm.kernels import QuantLinear

    from trilm.infer import load_inference_model
    from trilm.posthoc.evaluate import validation_loss

    model = load_inference_model(gptq_quantlm)
    linears = model.linear_modules()
    assert all(isinstance(m, QuantLinear) and m.packed.bits == 4 for m in linears.values())
    _, meta = read_snapshot_config(gptq_quantlm)
    loss = validation_loss(model, embedded_data["validation"], 64, max_sequences=4)
    assert loss == pytest.approx(meta.val_loss, rel=1e-6)


def test_quantlm_computes_the_in_process_quantized_model(gptq_quantlm, float_snapshot, embedded_data):
    """The written QuantLM (QuantLinear layers) = the float model quantized in process, same settings."""
    from trilm.infer import load_inference_model, load_with_meta
    from trilm.posthoc import UniformConfig
    from trilm.posthoc.calibration import CalibrationConfig, load_calibration
    from trilm.posthoc.engine import EngineConfig, quantize_blockwise
    from trilm.posthoc.layerwise import LayerwiseMethod

    calib = load_calibration(CalibrationConfig(source=str(embedded_data["train"]), samples=8, seq_len=64))
    model, _ = load_with_meta(float_snapshot)
    cfg = UniformConfig(bits=4, group_size=64, act_order=True)
    method = LayerwiseMethod("gptq", cfg, true_sequential=True)
    quantize_blockwise(model.requires_grad_(False), calib.windows, method, EngineConfig(progress=False))
    ids = calib.windows[:2, :16]
    with torch.no_grad():
        assert torch.allclose(load_inference_model(gptq_quantlm)(ids), model(ids), atol=1e-5)


def test_packed_layers_through_quantlinear_torch_and_interpreter(gptq_quantlm, monkeypatch):
    from trilm.kernels import QuantLinear

    packed = open_model(gptq_quantlm).weights.packed_layers()
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(0))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for name in ("layers.0.attn.wq", "layers.1.mlp.w_down"):
        weight = packed[name]
        xi = x[:, : weight.in_features]
        expected = xi.double() @ weight.dequantize().double().t()
        for backend in ("torch", "triton"):
            y = QuantLinear(weight, backend=backend)(xi)
            assert torch.allclose(y.double(), expected, atol=1e-4), (name, backend)


def test_rerunning_the_same_job_replaces_it(float_snapshot, embedded_data, tmp_path):
    out = tmp_path / "rtn"
    args = ("--method", "rtn", "--bits", "3", "--group-size", "128")
    assert quantize(float_snapshot, embedded_data, out, *args) == 0
    assert quantize(float_snapshot, embedded_data, out, *args) == 0
    assert leftovers(tmp_path) == []


def test_huggingface_llama_directory(float_snapshot, embedded_data, tmp_path):
    from safetensors.torch import load_file

    from trilm.infer import load_inference_model

    cfg, _ = read_snapshot_config(float_snapshot)
    hf = write_hf_files(cfg, load_file(str(float_snapshot / "model.safetensors")), tmp_path / "hf")
    shutil.copy(float_snapshot / "tokenizer.model", hf / "tokenizer.model")
    out = tmp_path / "q"
    assert quantize(hf, embedded_data, out, "--method", "gptq", "--bits", "2", "--group-size", "128") == 0
    assert read_snapshot_config(out)[1].extra["quant"]["source"] == str(hf.resolve())
    assert (out / "tokenizer.model").is_file()
    model = load_inference_model(out)
    assert torch.isfinite(model(torch.tensor([[1, 2, 3]]))).all()


# -- bad input: a clear error naming the problem, nothing written ---------------------------------------
def refused(capsys, snapshot, data, out, *args, match, samples=8):
    before = sorted(p.name for p in out.parent.iterdir())
    assert quantize(snapshot, data, out, *args, samples=samples) == 2
    err = capsys.readouterr().err
    assert match in err, err
    assert sorted(p.name for p in out.parent.iterdir()) == before
    assert leftovers(out.parent) == []


def test_trilm_checkpoint_is_refused(tmp_path, embedded_data, capsys):
    from tests.posthoc.conftest import tiny_model, write_snapshot

    trilm = write_snapshot(tiny_model(), tmp_path / "trilm", family="trilm")
    refused(
        capsys, trilm, embedded_data, tmp_path / "o", "--method", "gptq", "--bits", "4", match="a trilm model"
    )


@pytest.mark.parametrize(
    "args,match",
    [
        (("--method", "gptq", "--target", "gguf-q4_0", "--group-size", "64"), "group_size: target gguf-q4_0"),
        (("--method", "rtn", "--target", "gguf-q8_0", "--bits", "4"), "bits: target gguf-q8_0"),
        (("--method", "gptq", "--target", "gguf-q4_1", "--act-order"), "act_order: target gguf-q4_1"),
        (
            ("--method", "gptq", "--target", "gguf-q4_0", "--scale-dtype", "float32"),
            "target gguf-q4_0 stores fp16",
        ),
        (("--method", "omniquant", "--target", "gguf-q4_0"), "--target: not a setting of --method omniquant"),
        (("--method", "gptq", "--bits", "5"), "bits: must be one of"),
        (("--method", "gptq", "--bits", "4", "--group-size", "96"), "group_size=96 does not divide"),
        (("--method", "rtn", "--bits", "4", "--epochs", "3"), "--epochs: not a setting of --method rtn"),
        (("--method", "omniquant", "--mode", "W4A4"), "no activation quantizer"),
    ],
)
def test_settings_the_format_cannot_store_are_refused(
    float_snapshot, embedded_data, tmp_path, capsys, args, match
):
    refused(capsys, float_snapshot, embedded_data, tmp_path / "o", *args, match=match)


def test_calibration_data_shorter_than_requested(float_snapshot, embedded_data, tmp_path, capsys):
    refused(
        capsys,
        float_snapshot,
        embedded_data,
        tmp_path / "o",
        "--method",
        "gptq",
        "--bits",
        "4",
        match="were requested",
        samples=10**6,
    )


def test_data_free_rtn_needs_no_calibration(float_snapshot, embedded_data, tmp_path, capsys):
    """RTN reads no data: without --calib it writes the very QuantLM it writes with one (which is not read:
    a calibration set far longer than the data is no error), and records no calibration."""
    args = ("--method", "rtn", "--bits", "4", "--group-size", "64", "--no-progress")
    plain = tmp_path / "plain"
    assert main(["quantize", str(float_snapshot), "--out", str(plain), *args]) == 0
    given = tmp_path / "given"
    assert quantize(float_snapshot, embedded_data, given, *args, samples=10**6) == 0
    assert "uses no calibration data" in capsys.readouterr().out
    for name in ("packed.safetensors", "model.safetensors"):  # header order may vary: compare contents
        with safe_open(str(plain / name), "pt") as a, safe_open(str(given / name), "pt") as b:
            assert a.metadata() == b.metadata() and sorted(a.keys()) == sorted(b.keys())
            assert all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in a.keys())  # noqa: SIM118
    quant = read_snapshot_config(plain)[1].extra["quant"]
    assert quant["calibration"] is None and quant["calibration_data"] is None
    assert read_snapshot_config(given)[1].extra["quant"]["calibration"] is None


def test_methods_that_read_data_name_the_missing_calib(float_snapshot, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["quantize", str(float_snapshot), "--out", str(out), "--method", "gptq", "--bits", "4"]) == 2
    assert "--calib: --method gptq needs calibration data" in capsys.readouterr().err
    assert not out.exists()


def test_output_directory_with_another_model_is_left_alone(float_snapshot, embedded_data, tmp_path, capsys):
    other = shutil.copytree(float_snapshot, tmp_path / "other")
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    refused(
        capsys, float_snapshot, embedded_data, other, "--method", "rtn", "--bits", "4", match="already holds"
    )
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("mine")
    refused(capsys, float_snapshot, embedded_data, junk, "--method", "rtn", "--bits", "4", match="not empty")


def test_the_source_is_opened_once(float_snapshot, tmp_path, monkeypatch):
    """``trilm quantize`` reads the source's context length before building the job, and the job reuses
    that opened model: one open (one COMPLETE check, one config parse) of the source per command."""
    import trilm.posthoc.quantlm as quantlm
    import trilm.store.open as store_open

    opened: list[Path] = []
    real = store_open.open_model

    def counting(path, *args, **kwargs):
        opened.append(Path(path).resolve())
        return real(path, *args, **kwargs)

    monkeypatch.setattr(quantlm, "open_model", counting)
    monkeypatch.setattr(store_open, "open_model", counting)
    out = tmp_path / "rtn"
    args = ["quantize", str(float_snapshot), "--out", str(out), "--method", "rtn", "--bits", "4"]
    assert main([*args, "--group-size", "64", "--no-progress"]) == 0
    assert opened.count(float_snapshot.resolve()) == 1, opened
