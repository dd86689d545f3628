"""trilm's lm-eval model: agrees with lm-eval's ``hf`` model on the HF export, runs the offline tasks."""

from __future__ import annotations

import math

import pytest
from lm_eval.api.instance import Instance

from trilm.eval.harness import LOCAL_TASKS, metrics, run_lm_eval
from trilm.eval.lm_eval_model import TrilmLM
from trilm.eval.model import load_eval_model
from trilm.export.hf import export_snapshot_hf


def _requests(kind, args):
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


@pytest.fixture(scope="module")
def floatlm_pair(tmp_path_factory, tokenizer):
    from tests.export.conftest import write_run_snapshot
    from trilm.model import build_model, preset

    root = tmp_path_factory.mktemp("lmeval")
    model = build_model(preset("floatlm-nano", vocab_size=tokenizer.vocab_size, context=64), tp=1, seed=7)
    snap = write_run_snapshot(root / "floatlm-nano", model, tokenizer)
    hf_dir = export_snapshot_hf(snap, root / "hf", dtype="float32")
    return snap, hf_dir


def test_trilm_and_hf_models_give_the_same_loglikelihoods_and_generations(floatlm_pair, probe_texts):
    from lm_eval.models.huggingface import HFLM

    snap, hf_dir = floatlm_pair
    ours = TrilmLM(pretrained=str(snap), batch_size=3)
    hf = HFLM(pretrained=str(hf_dir), prefix_token_id=2, device="cpu", dtype="float32", batch_size=3)
    assert ours.prefix_token_id == 2 and ours.tok_encode("In the beginning") == hf.tok_encode(
        "In the beginning"
    )
    pairs = [
        ("In the beginning God created", " the heaven and the earth."),
        ("", "An empty context is conditioned on the prefix token."),
        ("def f(x):\n   ", " return x"),  # trailing context spaces move into the continuation
        (probe_texts[0][:600], " and so on"),  # longer than the 64-token context: truncated on the left
    ]
    a = ours.loglikelihood(_requests("loglikelihood", pairs))
    b = hf.loglikelihood(_requests("loglikelihood", pairs))
    for (la, ga), (lb, gb) in zip(a, b):
        assert abs(la - lb) <= 1e-4 and ga == gb
    docs = [(probe_texts[1][:900],), ("A short document.",)]  # the first spans several windows
    ra = ours.loglikelihood_rolling(_requests("loglikelihood_rolling", docs))
    rb = hf.loglikelihood_rolling(_requests("loglikelihood_rolling", docs))
    assert all(abs(x - y) <= 1e-4 for x, y in zip(ra, rb)) and ra[0] < ra[1] < 0
    prompts = [("In the beginning", {"until": ["\n"], "max_gen_toks": 8, "do_sample": False})] * 2
    prompts.append(("The Python interpreter", {"until": ["."], "max_gen_toks": 8, "do_sample": False}))
    ga = ours.generate_until(_requests("generate_until", prompts))
    gb = hf.generate_until(_requests("generate_until", prompts))
    assert ga == gb and ga[0] == ga[1]


def test_offline_tasks_run_through_the_harness(floatlm_pair):
    snap, _ = floatlm_pair
    results = run_lm_eval(str(snap), ["trilm_local"], limit=2, batch_size=4)
    values = metrics(results)
    for task in LOCAL_TASKS:
        assert any(k.startswith(task + "/") for k in values), task
    assert 0 <= values["trilm_cloze/acc"] <= 1 and math.isfinite(values["trilm_rolling/bits_per_byte"])


def test_a_model_trained_with_bos_is_evaluated_with_it(floatlm_pair):
    snap, _ = floatlm_pair
    em = load_eval_model(snap)
    em.add_bos = True
    lm = TrilmLM(pretrained=em)
    assert lm.prefix_token_id == em.tokenizer.bos_id == 1
    assert lm.tok_encode("word")[0] == 1 and lm.tok_encode("word", add_special_tokens=False)[0] != 1
