"""``trilm eval suite``: the one writer of results rows — recorded, perplexity and lm-eval columns."""

from __future__ import annotations

import json

import pytest

from trilm.bits import TERNARY_BITS
from trilm.cli import main
from trilm.config import ConfigError
from trilm.eval.suite import SuiteEvalConfig, evaluate_suite, write_rows, write_suite_table
from trilm.scaling.table import read_table
from trilm.store.integrity import complete_marker
from trilm.store.snapshot import read_snapshot_config, write_snapshot
from trilm.train.models import load_model


@pytest.fixture
def runs(make_snapshot):
    for step in (0, 10):
        make_snapshot("trilm", run="trilm-nano", step=step, seed=step)
    floatlm = make_snapshot("floatlm", run="floatlm-nano", step=10)
    return floatlm.parent.parent.parent / "trilm-nano", floatlm.parent.parent


def test_recorded_rows_then_perplexity_and_lm_eval_columns_merge_and_skip(runs, probe_texts, tmp_path):
    table = tmp_path / "results.csv"
    rows = evaluate_suite(runs, table)
    assert sorted((r.run, r.step, r.eval) for r in rows) == [
        ("floatlm-nano", 10, "val_loss"), ("trilm-nano", 0, "val_loss"), ("trilm-nano", 10, "val_loss")
    ]  # fmt: skip
    bits = {r.family: r.bits_per_param for r in rows}
    linear, params = rows[0].linear_params, rows[0].params
    assert bits["floatlm"] == 16.0
    assert bits["trilm"] == pytest.approx((TERNARY_BITS * linear + 16 * (params - linear)) / params)
    assert write_suite_table(list(runs), table) == (0, 3)  # the compatible entry point: nothing new

    text = tmp_path / "doc.txt"
    text.write_text(probe_texts[1][:1000])
    evals = SuiteEvalConfig(data=[str(text)], max_tokens=120, tasks=["trilm_cloze"], limit=2, progress=False)
    new = evaluate_suite([runs[1]], table, evals)
    assert sorted(r.eval for r in new) == ["ppl/doc", "val_loss"]
    written = {(r.run, r.step, r.eval): r for r in read_table(table)}
    merged = written[("floatlm-nano", 10, "val_loss")]
    assert 0 <= float(merged.extra["lm_eval/trilm_cloze/acc"]) <= 1 and merged.extra["lm_eval_tasks"]
    ppl = written[("floatlm-nano", 10, "ppl/doc")]
    assert ppl.extra["eval_tokens"] == "120" and float(ppl.extra["ppl"]) > 1
    assert evaluate_suite([runs[1]], table, evals) == []  # done already: skipped without loading
    assert len(read_table(table)) == 4

    assert main(["eval", "suite", str(runs[0]), "--table", str(table), "--data", str(text),
                 "--max-tokens", "60", "--no-progress"]) == 0  # fmt: skip
    assert len(read_table(table)) == 6


def test_quantlm_rows_get_their_family_run_and_stored_bits(make_snapshot, tmp_path):
    from trilm.formats import IntWeight

    snap = make_snapshot("floatlm", run="floatlm-nano", step=10)
    cfg, meta = read_snapshot_config(snap)
    state = load_model(snap, tp=1).full_state_dict()
    packed = {k.removesuffix(".weight"): IntWeight.from_float(v, 4, 64) for k, v in state.items()
              if k.startswith("layers.") and "norm" not in k}  # fmt: skip
    floats = {k: v for k, v in state.items() if k.removesuffix(".weight") not in packed}
    meta.extra["quant"] = {"method": "rtn", "options": {"bits": 4}, "bits": {"paper": 4.25, "stored": None}}
    meta.val_loss = 5.75
    quant = tmp_path / "floatlm-nano-rtn4"
    write_snapshot(quant, cfg, meta, floats, packed)
    (row,) = evaluate_suite([quant], None)
    assert (row.run, row.family, row.step, row.loss) == ("floatlm-nano-rtn4", "quantlm-rtn-4", 10, 5.75)
    linear, params = row.linear_params, row.params
    assert row.bits_per_param == pytest.approx((4.25 * linear + 16 * (params - linear)) / params)
    weights = sum(p.out_features * p.in_features for p in packed.values())
    stored = sum(p.storage_bits() for p in packed.values()) / weights
    expected = (stored * linear + 16 * (params - linear)) / params
    assert float(row.extra["stored_bits_per_param"]) == pytest.approx(expected)


def test_bad_paths_and_conflicts_are_named(runs, tmp_path):
    with pytest.raises(ConfigError, match="not a run directory"):
        evaluate_suite([tmp_path / "nothing"], None)
    table = tmp_path / "t.csv"
    evaluate_suite([runs[1]], table)
    cfg_path = runs[1] / "snapshots/step-10/config.json"
    payload = json.loads(cfg_path.read_text())
    payload["meta"]["val_loss"] = 9.0
    cfg_path.write_text(json.dumps(payload))
    complete = cfg_path.parent / "COMPLETE"  # re-sealed: an edit behind the manifest's back is refused
    complete.write_text(complete_marker({"step": 10})(cfg_path.parent)["COMPLETE"])
    assert evaluate_suite([runs[1]], table) == []  # in the table already: not even opened
    with pytest.raises(ConfigError, match="already present with different values"):
        write_rows(table, evaluate_suite([runs[1]], None))
    evaluate_suite([runs[1]], table, SuiteEvalConfig(replace=True))
    assert [r.loss for r in read_table(table)] == [9.0]
