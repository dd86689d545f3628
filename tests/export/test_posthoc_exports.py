"""The library pieces of ``experiments/posthoc_real/exports.py`` on a nano model (:mod:`trilm.eval.runtimes`,
:mod:`trilm.export.stored`): another runtime's logits are scored exactly as ``trilm eval ppl`` scores trilm's,
and the bits per weight read from the exported files are the formats' own."""

from __future__ import annotations

import math

import pytest
import torch

from tests.export.conftest import corpus_texts
from tests.export.test_gguf_blocks import quantize
from trilm.cli import main
from trilm.eval import runtimes
from trilm.eval.model import load_eval_model
from trilm.eval.ppl import evaluate_perplexity
from trilm.export import stored


def held_out(tmp_path, em, n: int = 150) -> tuple[torch.Tensor, object]:
    from trilm.data.text_source import token_stream

    data = tmp_path / "held-out.txt"
    data.write_text("\n\n".join(corpus_texts("validation", 6)))
    return token_stream(data, em.tokenizer, max_tokens=n), data


def test_logits_adapter_scores_the_windows_of_trilm_eval_ppl(make_snapshot, tmp_path):
    """One window at a time through :class:`Logits` gives ``trilm eval ppl``'s perplexity (batched there),
    including a last window shorter than the others."""
    em = load_eval_model(make_snapshot("floatlm", seed=3))
    tokens, data = held_out(tmp_path, em)
    want = evaluate_perplexity(em, data, seq_len=32, max_tokens=150, batch_size=4)
    adapter = runtimes.Logits(
        lambda ids: em.logits(torch.tensor([ids]))[0], 32, em.prefix_token_id, em.cfg.padded_vocab
    )
    got = runtimes.runtime_ppl(adapter, tokens, 32)
    assert (got["tokens"], got["windows"]) == (want.tokens, want.windows) == (150, 5)
    assert math.isclose(got["ppl"], want.ppl, rel_tol=1e-5)


def test_logits_adapter_refuses_a_narrower_vocabulary(make_snapshot):
    em = load_eval_model(make_snapshot("floatlm"))
    adapter = runtimes.Logits(
        lambda ids: torch.zeros(len(ids), 10), 32, em.prefix_token_id, em.cfg.padded_vocab
    )
    with pytest.raises(ValueError, match="trilm scores"):
        adapter.logits(torch.zeros(1, 4, dtype=torch.long))


def test_bits_read_from_the_files_are_the_formats(make_snapshot, tmp_path):
    """A Q4_0-target QuantLM: its GGUF holds 4.5 bits per block-linear weight, read back bit for bit as the
    QuantLM's weights; its compressed-tensors export 4 + 16/32 (codes and fp16 scales; ``weight_shape``
    adds two int32 per layer); the QuantLM itself as its codec stores it."""
    quantlm = tmp_path / "q"
    assert (
        quantize(
            make_snapshot("floatlm", seed=4), quantlm, tmp_path, "--method", "rtn", "--target", "gguf-q4_0"
        )
        == 0
    )
    gguf, ct = tmp_path / "q.gguf", tmp_path / "ct"
    assert main(["export", "gguf", str(quantlm), str(gguf)]) == 0
    read = stored.gguf_bits(gguf)
    assert read["linear_bits"] == 4.5 and read["types"]["ffn_down"] == "Q4_0"
    check = stored.gguf_matches_quantlm(gguf, quantlm)
    assert check["bit_for_bit"] == check["tensors"] > 0 and check["max_abs_diff"] == 0.0
    assert stored.quantlm_bits(quantlm) >= 4.5
    pytest.importorskip(
        "compressed_tensors", reason="compressed-tensors is not installed (pip install .[dev])"
    )
    assert main(["export", "compressed-tensors", str(quantlm), str(ct)]) == 0
    assert 4.5 < stored.ctensors_bits(ct) < 4.52
    assert stored.weight_bytes(ct) == sum(p.stat().st_size for p in ct.glob("*.safetensors"))


def test_llama_cpp_scores_the_f16_export_as_trilm(make_snapshot, tmp_path):
    """llama.cpp on the F16 GGUF, through the same windows, within F16 rounding of trilm's perplexity."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the bench extra)")
    snap = make_snapshot("floatlm", seed=5)
    em = load_eval_model(snap)
    tokens, data = held_out(tmp_path, em, n=96)
    gguf = tmp_path / "f16.gguf"
    assert main(["export", "gguf", str(snap), str(gguf), "--type", "f16"]) == 0
    logits, _llm = runtimes.llama_cpp_logits(gguf, 32, 1, em.prefix_token_id, em.cfg.padded_vocab)
    got = runtimes.runtime_ppl(logits, tokens, 32)
    want = evaluate_perplexity(em, data, seq_len=32, max_tokens=96)
    assert got["windows"] == want.windows == 3
    assert math.isclose(got["ppl"], want.ppl, rel_tol=1e-2)
