"""CUDA-graph decode against eager decode and the full forward (needs a GPU; skipped without one)."""

import pytest
import torch

from tests.serve.conftest import VOCAB, greedy_reference, nano, random_state
from trilm.infer import from_state_dict, prepare_for_inference
from trilm.serve import Engine, SamplingParams

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def _model(family="floatlm", pack_native=False, dtype=torch.float32, **cfg):
    config = nano(family, kv_heads=2, **cfg)
    model = from_state_dict(config, random_state(config, seed=3), pack_native=pack_native)
    return prepare_for_inference(model, device=CUDA, dtype=dtype)


def _prompts(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in lengths]


def test_graph_logits_equal_eager_logits_with_padding_rows():
    model = _model()
    graphs, eager = Engine(model, max_batch=8), Engine(model, max_batch=8, cuda_graphs=False)
    assert graphs.graphs is not None and eager.graphs is None
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for engine in (graphs, eager):
        for p in _prompts([3, 30, 11]):  # 3 running → batch bucket 4, one padding row
            engine.submit(p, params)
        engine.step()
    tokens = [s.last_token for s in graphs.running]
    positions = [s.position for s in graphs.running]
    assert tokens == [s.last_token for s in eager.running]
    with torch.no_grad():
        replayed = graphs.graphs.run(tokens, positions).clone()
        direct = eager._decode_eager(tokens, positions)
    assert (replayed - direct).abs().max() <= 1e-5


def test_greedy_with_graphs_equals_full_forward_while_batches_change():
    """Requests join and leave, so new buckets are captured while other sequences are live."""
    model = _model()
    engine = Engine(model, max_batch=4)
    prompts = _prompts([5, 17, 2, 40, 9, 23], seed=1)
    lengths = [12, 3, 30, 7, 15, 20]
    handles = [
        engine.submit(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
        for p, n in zip(prompts, lengths)
    ]
    for prompt, n, handle in zip(prompts, lengths, handles):
        assert handle.result().token_ids == greedy_reference(model, prompt, n)
    assert len(engine.graphs._graphs) >= 3


def test_packed_trilm_decodes_in_graphs_like_eager():
    model = _model("trilm", pack_native=True)
    graphs, eager = Engine(model, max_batch=4), Engine(model, max_batch=4, cuda_graphs=False)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = _prompts([6, 19], seed=2)
    a = graphs.generate(prompts, params)
    b = eager.generate(prompts, params)
    assert [x.token_ids for x in a] == [x.token_ids for x in b]


def test_bf16_engine_serves_and_never_samples_padding():
    model = _model(dtype=torch.bfloat16)
    engine = Engine(model, max_batch=8)
    params = SamplingParams(temperature=1.5, max_tokens=30, seed=0, ignore_eos=True)
    outs = engine.generate(_prompts([4, 8, 12, 16, 20], seed=3), params)
    assert all(len(o.token_ids) == 30 and max(o.token_ids) < VOCAB for o in outs)
    assert engine.graphs.capture_all() == len(engine.graphs.batch_buckets) * len(engine.graphs.span_buckets)


@pytest.mark.slow  # compiles a decode step and a prefill step (tens of seconds cold): --full only
def test_compiled_steps_captured_as_graphs_decode_like_eager():
    """``compile=True`` on CUDA: each batch bucket's decode step is compiled (inductor fusing the
    elementwise work around the packed layers' operator), then captured and replayed as a graph."""
    model = _model("trilm", pack_native=True)
    compiled = Engine(model, max_batch=2, max_seq_len=64, compile=True)
    eager = Engine(model, max_batch=2, max_seq_len=64, cuda_graphs=False)
    assert compiled.graphs is None and compiled.compiled.capture
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [*_prompts([6, 19], seed=4), [5]]  # a one-token prompt takes the eager prefill
    assert compiled.compiled.warm() == 2
    a = compiled.generate(prompts, params)
    b = eager.generate(prompts, params)
    assert compiled.compiled.failure is None, compiled.compiled.failure
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert all(graph is not None for graph, _ in compiled.compiled._graphs.values())
