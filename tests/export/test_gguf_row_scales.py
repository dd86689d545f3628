"""The per-output-row absmean scale (``quant.scale_group: row``, the non-learned half of ParetoQ's per-row
scale) goes into GGUF TQ2_0/TQ1_0 as it is: a 256-weight block lies inside one row, so its one fp16 scale
is that row's scale and no tensor needs folding or falling back."""

from __future__ import annotations

import pytest
import torch

from tests.export.test_gguf import WIDE, _ids, _llama_cpp_logits, _tensors
from trilm.export.gguf import export_snapshot_gguf
from trilm.train.models import load_model


@pytest.mark.parametrize("qtype", ["tq2_0", "tq1_0"])
def test_row_scales_are_carried_by_tq_blocks(make_snapshot, tmp_path, qtype):
    snap = make_snapshot("trilm", seed=5, quant={"scale_group": "row"}, **WIDE)
    out = tmp_path / f"rows-{qtype}.gguf"
    report = export_snapshot_gguf(snap, out, qtype=qtype)
    assert report.folded == [] and report.fallback == {}
    _, w, _ = _tensors(out)
    for name, tensor in w.items():
        if not (name.startswith("blk.") and tensor.dim() == 2):
            continue
        magnitude = tensor.abs()
        row_scale = magnitude.amax(-1, keepdim=True)
        assert ((magnitude == 0) | (magnitude == row_scale)).all(), name  # one magnitude per row
        assert row_scale.unique().numel() > 1, name  # and the rows' scales differ: one per row
    model = load_model(snap, tp=1).eval()
    with torch.no_grad():
        ours = model(_ids())
    # the file's scales are the rows' scales rounded to fp16 (relative error ≤ 2^-11 per weight)
    assert (ours - _llama_cpp_logits(out, _ids())).abs().max() < 2e-3 * ours.abs().max()
