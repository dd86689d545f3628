"""The engine against greedy decoding with the plain full forward, and its batching and cache edge cases."""

import pytest
import torch

from tests.serve.conftest import VOCAB, greedy_reference, nano, random_state, write_snapshot
from trilm.formats import IntWeight
from trilm.infer import from_state_dict, load_inference_model
from trilm.model.snapshot import SnapshotMeta
from trilm.serve import Engine, RequestError, SamplingParams
from trilm.serve.graphs import DecodeGraphs
from trilm.store import snapshot as store

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def _prompts(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in lengths]


def _check_against_reference(model, engine, prompts, max_tokens):
    handles = [
        engine.submit(p, SamplingParams(temperature=0, max_tokens=m, ignore_eos=True))
        for p, m in zip(prompts, max_tokens)
    ]
    for prompt, m, handle in zip(prompts, max_tokens, handles):
        out = handle.result()
        assert out.token_ids == greedy_reference(model, prompt, m)
        assert out.finish_reason == "length" and out.prompt_tokens == len(prompt)


@pytest.mark.parametrize("family", ["floatlm", "trilm", "bilm"])
def test_greedy_equals_full_forward_with_continuous_batching(tmp_path, family):
    """Five requests of different lengths through three slots: later ones join as earlier ones finish."""
    model = load_inference_model(write_snapshot(tmp_path / family, nano(family, kv_heads=2)))
    engine = Engine(model, max_batch=3)
    _check_against_reference(model, engine, _prompts([5, 17, 1, 40, 9]), [12, 3, 20, 7, 15])
    assert engine.num_running == 0 and engine.num_waiting == 0


def test_packed_quantlm_snapshot_is_served(tmp_path):
    """A QuantLM as the post-hoc methods write it: IntWeight block linears in a packed snapshot."""
    cfg = nano("floatlm")
    state = random_state(cfg, seed=3)
    packed = {
        name.removesuffix(".weight"): IntWeight.from_float(state[name], bits=4, group_size=32)
        for name in state
        if name.startswith("layers.") and "norm" not in name
    }
    rest = {k: v for k, v in state.items() if k.removesuffix(".weight") not in packed}
    meta = SnapshotMeta(family="floatlm", size="nano", extra={"quant": {"method": "rtn", "bits": 4}})
    store.write_snapshot(tmp_path / "q", cfg, meta, rest, packed)
    engine = Engine.load(tmp_path / "q", device="cpu", max_batch=2)
    kinds = {type(m).__name__ for m in engine.model.linear_modules().values()}
    assert kinds == {"QuantLinear"}
    _check_against_reference(engine.model, engine, _prompts([6, 11, 3], seed=1), [8, 5, 10])


def test_trilm_served_as_packed_ternary(tmp_path):
    path = write_snapshot(tmp_path / "t", nano("trilm"), seed=4)
    engine = Engine.load(path, device="cpu", packed=True, backend="torch", max_batch=2)
    assert {m.format for m in engine.model.linear_modules().values()} == {"ternary"}
    _check_against_reference(engine.model, engine, _prompts([7, 2], seed=2), [10, 10])


def test_pruned_model_with_per_layer_shapes(tmp_path):
    """Layer 0 keeps one of two KV heads and a narrower MLP; layer 1 has neither (residual only)."""
    cfg = nano("floatlm", kv_heads=2, layer_kv_heads=[1, 0], layer_ffn=[96, 0])
    model = load_inference_model(write_snapshot(tmp_path / "p", cfg, seed=5))
    engine = Engine(model, max_batch=2)
    assert engine.cache.keys[1] is None and engine.cache.keys[0].shape[1] == 1
    _check_against_reference(model, engine, _prompts([4, 13, 8], seed=3), [9, 4, 11])


def _tiny_engine(max_batch=4, **cfg):
    model = from_state_dict(nano("floatlm", **cfg), random_state(nano("floatlm", **cfg), seed=9))
    return model, Engine(model, max_batch=max_batch)


def test_join_mid_batch_and_cancel_frees_the_slot():
    model, engine = _tiny_engine(max_batch=3)
    p = _prompts([6, 9, 4, 12], seed=4)
    a = engine.submit(p[0], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    b = engine.submit(p[1], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    c = engine.submit(p[2], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    for _ in range(5):
        engine.step()
    assert engine.num_running == 3
    a.cancel()  # slot 0 frees; the last running sequence moves into it
    d = engine.submit(p[3], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    engine.step()
    assert a.finished and a.finish_reason == "cancelled" and engine.num_running == 3
    assert len(a.token_ids) == 6
    for prompt, handle in ((p[1], b), (p[2], c), (p[3], d)):
        out = handle.result()
        assert out.token_ids == greedy_reference(model, prompt, len(out.token_ids))
    assert engine.num_running == 0


def test_bucketed_static_decode_step_on_cpu():
    """The CUDA-graph decode step run eagerly: static input buffers, batch buckets whose padding rows
    write to the scratch position, attention-span buckets (128/256/512). Greedy output still equals the
    full forward while sequences join, leave and cross span buckets."""
    model, engine = _tiny_engine(max_batch=8, context=512)
    engine.graphs = DecodeGraphs(model, engine.cache, capture=False)
    assert engine.graphs.span_buckets == [128, 256, 512] and engine.graphs.batch_buckets == [1, 2, 4, 8]
    prompts = _prompts([5, 17, 1, 120, 9, 3, 250], seed=6)
    _check_against_reference(model, engine, prompts, [12, 3, 20, 30, 15, 9, 4])


def test_context_edges_and_first_token_finish():
    model, engine = _tiny_engine(max_batch=2)
    context = model.cfg.context
    [full] = _prompts([context - 3], seed=5)
    long_run = engine.submit(full, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    one = engine.submit(_prompts([5])[0], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    assert one.result().token_ids == greedy_reference(model, _prompts([5])[0], 1)
    assert long_run.result().token_ids == greedy_reference(model, full, 3)


def test_requests_that_cannot_run_are_refused():
    _, engine = _tiny_engine()
    context = engine.max_seq_len
    with pytest.raises(RequestError, match="prompt: must not be empty"):
        engine.submit([], GREEDY)
    with pytest.raises(RequestError, match=f"leave no room to generate within the context of {context}"):
        engine.submit([1] * context, GREEDY)
    with pytest.raises(RequestError, match=r"max_tokens: prompt \(100 tokens\) \+ max_tokens \(40\)"):
        engine.submit([1] * 100, SamplingParams(max_tokens=40))
    with pytest.raises(RequestError, match=r"token ids \[400\] outside the vocabulary \[0, 400\)"):
        engine.submit([3, 400], GREEDY)
    with pytest.raises(RequestError, match="text needs a tokenizer"):
        engine.submit("hello", GREEDY)


def test_text_stop_strings_stream_and_seed(tmp_path, tokenizer):
    path = write_snapshot(tmp_path / "s", nano("floatlm"), tokenizer, seed=6)
    engine = Engine.load(path, device="cpu", max_batch=4)
    assert engine.tokenizer.hash == tokenizer.hash and engine.vocab_size == VOCAB
    prompt = "In the beginning"
    ids = tokenizer.encode(prompt)
    free = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    assert free.token_ids == greedy_reference(engine.model, ids, 30)
    assert free.text == tokenizer.decode(ids + free.token_ids)[len(prompt) :]

    deltas = list(engine.stream(prompt, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)))
    assert "".join(d.text for d in deltas) == free.text
    assert [t for d in deltas for t in d.token_ids] == free.token_ids
    assert deltas[-1].finish_reason == "length" and all(d.finish_reason is None for d in deltas[:-1])

    stop = free.text[len(free.text) // 2 : len(free.text) // 2 + 3]
    cut = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=30, stop=(stop,)))[0]
    assert cut.finish_reason == "stop" and cut.text == free.text[: free.text.index(stop)]

    first = free.token_ids[4]
    by_id = engine.generate(
        prompt, SamplingParams(temperature=0, max_tokens=30, stop_token_ids=(first,), ignore_eos=True)
    )[0]
    assert by_id.finish_reason == "stop"
    assert by_id.token_ids == free.token_ids[: free.token_ids.index(first) + 1]

    sampled = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, seed=11, max_tokens=20, ignore_eos=True)
    alone = engine.generate(prompt, sampled)[0]
    crowd = engine.generate(["Other text", prompt, "And more"], sampled)
    assert crowd[1].token_ids == alone.token_ids and crowd[1].text == alone.text


def test_eos_ends_the_request_and_is_not_text(tmp_path, tokenizer):
    path = write_snapshot(tmp_path / "e", nano("floatlm"), tokenizer, seed=6)
    engine = Engine.load(path, device="cpu", max_batch=2)
    eos = tokenizer.eos_id
    prompt = tokenizer.encode("In the beginning")
    ref = greedy_reference(engine.model, prompt, 10)
    head = engine.model.head.weight.data
    head[eos] = 10 * head[ref[2]]  # EOS now beats the token that won at step 3 (if not earlier)
    expect = greedy_reference(engine.model, prompt, 10)
    assert eos in expect[:3]
    expect = expect[: expect.index(eos) + 1]
    out = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=10))[0]
    assert out.token_ids == expect and out.finish_reason == "stop"
    assert out.text == tokenizer.decode(prompt + expect[:-1])[len("In the beginning") :]


def test_padding_ids_are_never_produced():
    """Padding rows of the head made the most likely by far: the engine still keeps to the vocabulary."""
    model, engine = _tiny_engine(max_batch=4)
    head = model.head.weight.data
    head[VOCAB:] = 50 * head[:1]
    ids = torch.tensor([_prompts([6])[0]])
    with torch.no_grad():
        assert int(model(ids)[0, -1].argmax()) >= VOCAB  # the raw model would pick padding
    outs = engine.generate(
        _prompts([6, 9, 3], seed=8),
        SamplingParams(temperature=2.0, max_tokens=20, seed=1, ignore_eos=True),
    )
    outs += engine.generate(_prompts([6], seed=8), SamplingParams(temperature=0, max_tokens=20))
    assert all(0 <= t < VOCAB for out in outs for t in out.token_ids)
