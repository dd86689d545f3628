"""``trilm quantize --method {pbllm,billm,stbllm}`` end to end on a small FloatLM: the QuantLM loads,
evaluates, runs through QuantLinear, records and prints value / minimum / stored bits; bad settings."""

from __future__ import annotations

import pytest
import torch

from tests.posthoc.conftest import tiny_model, write_snapshot
from tests.posthoc.test_binary_model import SMALL
from trilm.cli import main
from trilm.store.hf import write_hf_files
from trilm.store.open import open_model
from trilm.store.snapshot import read_snapshot_config


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    """One torch thread: the binary searches run many small ops, where a second thread on a loaded 2-core
    machine costs far more in synchronization than it saves (20–40× here)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def small_snapshot(tmp_path_factory, embedded_data):
    return write_snapshot(
        tiny_model(**SMALL), tmp_path_factory.mktemp("small") / "snap", embedded_data["tokenizer"]
    )


def quantize(snapshot, data, out, *extra):
    argv = ["quantize", str(snapshot), "--calib", str(data["train"]), "--samples", "4", "--seq-len", "32"]
    argv += ["--out", str(out), "--no-progress", "--eval", str(data["validation"]), "--eval-sequences", "2"]
    return main([*argv, *extra])


@pytest.mark.parametrize(
    ("method", "args", "fmt"),
    [
        ("stbllm", ("--n", "4", "--m", "8"), "residual_binary"),
        ("pbllm", ("--low-frac", "0.8", "--qat-steps", "2", "--qat-batch", "2"), "partial_binary"),
    ],
)
def test_quantize_cli_binary_methods(small_snapshot, embedded_data, tmp_path, capsys, method, args, fmt):
    from trilm.kernels import QuantLinear

    from trilm.infer import load_inference_model
    from trilm.posthoc.evaluate import validation_loss

    out = tmp_path / method
    assert quantize(small_snapshot, embedded_data, out, "--method", method, *args) == 0
    printed = capsys.readouterr().out
    assert "bits/weight per layer: paper (value bits) / information-theoretic minimum / stored" in printed
    assert "layers.1.mlp.w_down" in printed and "minimum" in printed
    _, meta = read_snapshot_config(out)
    bits = meta.extra["quant"]["bits"]
    packed = open_model(out).weights.packed_layers()
    assert {p.FORMAT for p in packed.values()} == {fmt}
    assert bits["minimum"] <= bits["stored"] <= 1.1 * bits["minimum"] + 0.05
    assert bits["paper"] < bits["minimum"]
    layers = meta.extra["quant"]["layers"]
    assert all({"value_bits", "minimum_bits"} <= set(rec) for rec in layers.values())
    if method == "pbllm":
        settings = meta.extra["quant"]["method_settings"]
        assert "qat_loss_last" in settings and settings["qat_steps"] == 2
    else:
        assert bits["paper"] == pytest.approx(0.5 * (1 + 0.1), abs=0.12)
    model = load_inference_model(out)
    assert all(isinstance(m, QuantLinear) for m in model.linear_modules().values())
    loss = validation_loss(model, embedded_data["validation"], 32, max_sequences=2)
    assert loss == pytest.approx(meta.val_loss, rel=1e-6)
    for name, p in packed.items():
        assert torch.isfinite(p.dequantize()).all(), name


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("--method", "stbllm", "--n", "9", "--m", "8"), "n, m: need"),
        (("--method", "stbllm", "--m", "12", "--blocksize", "96", "--n", "4"), "not a multiple of m=12"),
        (("--method", "pbllm", "--low-frac", "2"), "low_frac"),
        (("--method", "billm", "--n", "4"), "not a setting of --method billm"),
    ],
)
def test_bad_binary_settings_are_refused(small_snapshot, embedded_data, tmp_path, capsys, args, match):
    out = tmp_path / "o"
    assert (
        main(
            [
                "quantize",
                str(small_snapshot),
                "--calib",
                str(embedded_data["train"]),
                "--out",
                str(out),
                *args,
            ]
        )
        != 0
    )
    assert match in capsys.readouterr().err
    assert not out.exists()


def test_huggingface_llama_directory_with_billm(small_snapshot, embedded_data, tmp_path):
    import shutil

    from safetensors.torch import load_file

    from trilm.infer import load_inference_model

    cfg, _ = read_snapshot_config(small_snapshot)
    hf = write_hf_files(cfg, load_file(str(small_snapshot / "model.safetensors")), tmp_path / "hf")
    shutil.copy(small_snapshot / "tokenizer.model", hf / "tokenizer.model")
    out = tmp_path / "q"
    assert quantize(hf, embedded_data, out, "--method", "billm") == 0
    _, meta = read_snapshot_config(out)
    assert meta.extra["quant"]["source"] == str(hf.resolve())
    assert {p.FORMAT for p in open_model(out).weights.packed_layers().values()} == {"residual_binary"}
    model = load_inference_model(out)
    assert torch.isfinite(model(torch.tensor([[1, 2, 3]]))).all()
