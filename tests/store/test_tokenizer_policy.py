"""One tokenizer policy: the first candidate decides, and it must be the model's (hash and vocabulary)."""

from __future__ import annotations

import pytest

from tests.export.conftest import corpus_texts
from trilm.data.tokenizer import train_tokenizer
from trilm.store import StoreError, open_model


def test_run_tokenizer_own_copy_override_and_none(tmp_path, make_snapshot, tokenizer):
    snap = make_snapshot("floatlm")
    assert open_model(snap).tokenizer.path == snap.parent.parent / "tokenizer.model"
    given = open_model(snap, tokenizer=tokenizer.path).tokenizer
    assert given.source == "given" and given.hash == tokenizer.hash

    foreign = train_tokenizer(corpus_texts("train", 8), tmp_path / "f" / "tokenizer.model", vocab_size=400)
    with pytest.raises(StoreError, match=r"f/tokenizer.model: tokenizer hash .* differs from the"):
        open_model(snap, tokenizer=foreign.path)
    (snap / "tokenizer.model").write_bytes(foreign.path.read_bytes())  # a foreign copy next to the snapshot
    with pytest.raises(StoreError, match=r"step-10/tokenizer.model: .* it belongs to another model"):
        open_model(snap)  # refused, not skipped in favour of the run's: the directory is inconsistent
    (snap / "tokenizer.model").unlink()
    (snap.parent.parent / "tokenizer.model").unlink()
    none = open_model(snap).tokenizer
    assert (
        none.tokenizer is None
        and "no tokenizer.json or tokenizer.model next to the model or in its run directory" in none.reason
    )
    with pytest.raises(StoreError, match="pass --tokenizer"):
        none.require(snap)


def test_a_tokenizer_larger_than_the_model_is_refused(tmp_path, tokenizer):
    from trilm.model import build_model, preset
    from trilm.train.models import save_model

    small = save_model(build_model(preset("floatlm-nano", vocab_size=300), tp=1), tmp_path / "small")
    with pytest.raises(StoreError, match=r"has 512 tokens, more than the model's vocabulary \(300"):
        open_model(small, tokenizer=tokenizer.path)
