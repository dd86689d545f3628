"""``trilm eval ppl``: rolling windows that score every token once; agreement across model forms."""

from __future__ import annotations

import json
import math

import pytest
from lm_eval.api.instance import Instance

from trilm.cli import main
from trilm.eval.lm_eval_model import TrilmLM
from trilm.eval.model import load_eval_model
from trilm.eval.ppl import evaluate_perplexity, window_plan
from trilm.export.hf import export_snapshot_hf


@pytest.mark.parametrize(
    ("n", "seq_len", "stride"), [(10, 4, 4), (10, 4, 3), (3, 8, 8), (1, 1, 1), (17, 5, 1)]
)
def test_window_plan_scores_every_token_once(n, seq_len, stride):
    done = 0
    for start, end in window_plan(n, seq_len, stride):
        assert end - start <= seq_len and start <= done < end
        done = end
    assert done == n


def test_disjoint_windows_match_lm_eval_rolling_and_count_bytes(make_snapshot, probe_texts, tmp_path):
    snap = make_snapshot("trilm", seed=1, context=32, quant={"partitions": 2})
    text = probe_texts[0][:1500]
    path = tmp_path / "doc.txt"
    path.write_text(text)
    em = load_eval_model(snap)
    n_doc = len(em.tokenizer.encode(text))
    cut = evaluate_perplexity(em, path, max_tokens=n_doc)  # the document without its closing EOS
    rolling = TrilmLM(pretrained=em).loglikelihood_rolling(
        [Instance(request_type="loglikelihood_rolling", doc={}, arguments=(text,), idx=0)]
    )
    assert cut.tokens == n_doc and cut.windows == math.ceil(n_doc / 32)
    assert cut.nll == pytest.approx(-rolling[0], rel=1e-5)
    assert cut.bytes == len(text.encode("utf-8"))
    assert cut.bits_per_byte == pytest.approx(cut.nll / math.log(2) / cut.bytes)
    full = evaluate_perplexity(em, path)
    assert full.tokens == n_doc + 1 and full.bytes == cut.bytes
    strided = evaluate_perplexity(em, path, stride=8)
    assert strided.tokens == full.tokens and strided.windows > full.windows
    assert strided.loss != full.loss  # more context per prediction changes the numbers


def test_cli_on_jsonl_prepared_split_and_hf_export(make_snapshot, tokenizer, probe_texts, tmp_path, capsys):
    from trilm.data.prepare import PrepareConfig, prepare

    snap = make_snapshot("floatlm", seed=2, context=64)
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t[:800]}) + "\n" for t in probe_texts[:3]))
    out = tmp_path / "ppl.json"
    assert main(["eval", "ppl", str(snap), "--data", str(docs), "--json", str(out), "--no-progress"]) == 0
    assert "perplexity" in capsys.readouterr().out
    ours = json.loads(out.read_text())
    assert ours["ppl"] == pytest.approx(math.exp(ours["loss"])) and ours["bits_per_byte"] > 0
    hf_dir = export_snapshot_hf(snap, tmp_path / "hf", dtype="float32")
    from_hf = evaluate_perplexity(hf_dir, docs)
    assert from_hf.tokens == ours["tokens"] and from_hf.loss == pytest.approx(ours["loss"], rel=1e-5)

    from trilm.data import embedded_corpus_dir

    split = tmp_path / "validation"
    cfg = PrepareConfig(input=str(embedded_corpus_dir()), split="validation", tokenizer=str(tokenizer.path),
                        out=str(split), max_files=1, progress=False)  # fmt: skip
    prepare(cfg)
    res = evaluate_perplexity(snap, split, max_tokens=500)
    assert res.tokens == 500 and res.bytes > 500 and math.isfinite(res.loss)
