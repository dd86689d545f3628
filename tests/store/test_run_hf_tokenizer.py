"""A run trained on a Hugging Face tokenizer keeps it as ``tokenizer.json``: a ``tokenizer.json`` copied under
the SentencePiece name ``tokenizer.model`` made every snapshot of the run unloadable (SmolLM2 converted to a
TriLM: ``trilm eval ppl`` refused the run's tokenizer)."""

from __future__ import annotations

import json

from trilm.store.tokenizer import own_candidates


def test_run_directory_hf_tokenizer_is_a_candidate(tmp_path):
    run, snap = tmp_path / "run", tmp_path / "run" / "snapshots" / "step-0"
    snap.mkdir(parents=True)
    (run / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    assert own_candidates(snap, run) == [(run / "tokenizer.json", "run")]


def test_run_directory_sidecar_json_is_not_a_tokenizer(tmp_path):
    run, snap = tmp_path / "run", tmp_path / "run" / "snapshots" / "step-0"
    snap.mkdir(parents=True)
    (run / "tokenizer.json").write_text(json.dumps({"hash": "ab"}))
    assert own_candidates(snap, run) == []
