"""Suite export: every checkpoint as latent, HF, packed and GGUF, an index, atomic and resumable."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from gguf import GGUFReader
from transformers import AutoModelForCausalLM, AutoTokenizer

from trilm.cli import main
from trilm.eval.suite import evaluate_suite
from trilm.export.suite import SuiteExportConfig, export_suite
from trilm.infer import load_inference_model


@pytest.fixture
def runs(make_snapshot):
    for step in (0, 10):
        make_snapshot("trilm", run="trilm-nano", step=step, seed=step, hidden=256, ffn=512, heads=4, layers=1)
    floatlm = make_snapshot("floatlm", run="floatlm-nano", step=10)
    return [floatlm.parent.parent.parent / "trilm-nano", floatlm.parent.parent]


def test_suite_export_writes_every_format_and_an_index(runs, tmp_path, tokenizer, capsys):
    out = tmp_path / "suite"
    assert main(["export", "suite", *map(str, runs), "--out", str(out), "--no-progress"]) == 0
    assert "3 checkpoints written now, 3 in the suite index" in capsys.readouterr().out
    index = json.loads((out / "suite_index.json").read_text())["checkpoints"]
    assert [(e["family"], e["run"], e["step"]) for e in index] == [
        ("floatlm", "floatlm-nano", 10), ("trilm", "trilm-nano", 0), ("trilm", "trilm-nano", 10)
    ]  # fmt: skip
    tri = index[2]
    assert set(tri["paths"]) == {"latent", "hf", "packed", "gguf"} and set(tri["paths"]["gguf"]) == {
        "tq2_0",
        "tq1_0",
    }
    assert tri["tokens"] == 10 * 1024 and tri["val_loss"] == 5.5
    assert tri["bytes"]["packed"] < tri["bytes"]["hf"] < tri["bytes"]["latent"]
    flo = index[0]
    assert (
        "packed" not in flo["paths"] and "FloatLM" in flo["notes"]["packed"] and "f16" in flo["paths"]["gguf"]
    )
    with (out / "suite_index.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["step"] for r in rows] == ["10", "0", "10"] and int(rows[2]["bytes_packed"]) == tri["bytes"][
        "packed"
    ]

    step = out / "trilm-nano" / "step-10"
    card = (step / "README.md").read_text()
    assert "tokens seen | 10,240" in card and "validation loss" in card
    hf = AutoModelForCausalLM.from_pretrained(step / "hf", dtype=torch.float32).eval()
    ids = torch.tensor([tokenizer.encode("In the beginning")])
    assert AutoTokenizer.from_pretrained(step / "hf")("In the beginning").input_ids == ids[0].tolist()
    with torch.no_grad():
        latent = load_inference_model(step / "latent")(ids)
        packed = load_inference_model(step / "packed")(ids)
        assert (latent - hf(ids).logits).abs().max() < 5e-2  # fp16 HF weights
    assert (latent - packed).abs().max() < 5e-2  # fp16 float tensors in the packed export
    assert {t.name for t in GGUFReader(step / "gguf" / "tq1_0.gguf").tensors} >= {"blk.0.attn_q.weight"}
    rows = evaluate_suite([out], None)  # the exported suite evaluates like its runs
    assert sorted((r.run, r.step) for r in rows) == [
        ("floatlm-nano", 10),
        ("trilm-nano", 0),
        ("trilm-nano", 10),
    ]


def test_reruns_skip_finished_checkpoints_and_a_failure_leaves_nothing(
    runs, make_snapshot, tmp_path, monkeypatch
):
    out = tmp_path / "suite"
    cfg = SuiteExportConfig(out=str(out), gguf=False, progress=False, steps=[10])
    entries, written = export_suite(runs[:1], cfg)
    assert written == 1 and [e["step"] for e in entries] == [10]
    import trilm.export.packed as packed

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(packed, "export_snapshot_packed", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        export_suite(runs[:1], SuiteExportConfig(out=str(out), gguf=False, progress=False))
    assert sorted(p.name for p in (out / "trilm-nano").iterdir()) == ["step-10"]  # no half checkpoint
    monkeypatch.undo()
    entries, written = export_suite(runs[:1], SuiteExportConfig(out=str(out), gguf=False, progress=False))
    assert written == 1 and [e["step"] for e in entries] == [0, 10]
    assert export_suite(runs[:1], SuiteExportConfig(out=str(out), gguf=False, progress=False))[1] == 0
