"""Serving on a CPU: compiled steps against eager ones, packed layers against dequantized ones, the defaults.

The compiled steps (``torch.compile``, inductor's C++ backend) compile once per batch bucket and once for the
prefill; they must produce the eager engine's tokens, token for token. ``packed=True`` on CPU runs the
block linears on torch's int4 kernel in bf16; the engine must produce the tokens of the same model with
its layers dequantized, in the same dtype.
"""

import pytest
import torch
from trilm.kernels.cpu_dense import PrepackedLinear
from trilm.kernels.cpu_dense import supported as prepack_supported

from tests.serve.conftest import VOCAB, nano, random_state, write_snapshot
from trilm.config import ConfigError
from trilm.infer import from_state_dict
from trilm.serve import Engine, SamplingParams
from trilm.serve.cache import KVCache
from trilm.serve.loading import available_cpus, configure_threads, resolve_dtype


def _prompts(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in lengths]


def _tokens(engine, prompts, max_tokens):
    handles = [
        engine.submit(p, SamplingParams(temperature=0, max_tokens=m, ignore_eos=True))
        for p, m in zip(prompts, max_tokens)
    ]
    return [h.result().token_ids for h in handles]


@pytest.mark.slow
def test_compiled_steps_equal_eager_token_for_token():
    """Two requests of different lengths share the batch-2 graph, then the longer one runs alone in the
    batch-1 graph; a one-token prompt takes the eager prefill."""
    cfg = nano("floatlm")
    model = from_state_dict(cfg, random_state(cfg, seed=11))
    prompts, max_tokens = [*_prompts([5, 9], seed=2), [17]], [6, 14, 5]
    eager = _tokens(Engine(model, max_batch=2), prompts, max_tokens)
    engine = Engine(model, max_batch=2, compile=True)
    compiled = _tokens(engine, prompts, max_tokens)
    assert engine.compiled.failure is None, engine.compiled.failure
    assert compiled == eager
    assert sorted(engine.compiled._graphs) == [(1, 128), (2, 128)]


def test_compile_failure_falls_back_to_eager(monkeypatch):
    cfg = nano("floatlm")
    model = from_state_dict(cfg, random_state(cfg, seed=12))
    prompts = _prompts([4, 7], seed=3)
    eager = _tokens(Engine(model, max_batch=2), prompts, [5, 5])
    engine = Engine(model, max_batch=2, compile=True)

    def broken(*args):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(engine.compiled, "_decode_fn", broken)
    monkeypatch.setattr(engine.compiled, "_prefill_fn", broken)
    assert _tokens(engine, prompts, [5, 5]) == eager
    assert engine.compiled.failure == "RuntimeError: no C++ compiler"


def test_compile_is_refused_off_cpu_and_cuda():
    cfg = nano("floatlm")
    model = from_state_dict(cfg, random_state(cfg, seed=1)).to("meta")
    with pytest.raises(ConfigError, match="compile: the compiled steps run on CPU or CUDA, not on meta"):
        Engine(model, max_batch=1, compile=True)


def test_compiled_steps_capture_only_on_cuda():
    cfg = nano("floatlm")
    model = from_state_dict(cfg, random_state(cfg, seed=1))
    for compile in (False, True):
        with pytest.raises(ConfigError, match="cuda_graphs: CUDA graphs need the model on CUDA, not on cpu"):
            Engine(model, max_batch=1, compile=compile, cuda_graphs=True)
    engine = Engine(model, max_batch=1, compile=True)
    assert engine.graphs is None and not engine.compiled.capture


@pytest.mark.parametrize("family", ["trilm", "bilm"])
def test_packed_cpu_engine_equals_dequantized_engine(tmp_path, family):
    path = write_snapshot(tmp_path / family, nano(family, kv_heads=2), seed=5)
    packed = Engine.load(path, device="cpu", packed=True, max_batch=2)
    assert packed.dtype == torch.bfloat16  # the int4 CPU kernel's dtype
    layers = list(packed.model.linear_modules().values())
    assert all(layer._cpu_state is not None and layer._cpu_state.int4 is not None for layer in layers)
    dense = Engine.load(path, device="cpu", dtype=torch.bfloat16, max_batch=2, prepack=False)
    assert {type(m).__name__ for m in dense.model.linear_modules().values()} == {"Linear"}
    prompts, max_tokens = _prompts([6, 11], seed=4), [16, 12]
    assert _tokens(packed, prompts, max_tokens) == _tokens(dense, prompts, max_tokens)


@pytest.mark.skipif(not prepack_supported(), reason="oneDNN's bf16 linear is unavailable on this CPU")
@pytest.mark.parametrize("family", ["floatlm", "trilm"])
def test_prepacked_bf16_engine_equals_plain_linears(tmp_path, family):
    """bf16 on CPU: the float linears (and the head) reordered once for oneDNN give the tokens of the
    same model with plain ``nn.Linear`` layers; ``prepack=False`` keeps them, fp32 never converts."""
    path = write_snapshot(tmp_path / family, nano(family, kv_heads=2), seed=8)
    packed = family != "floatlm"
    fast = Engine.load(path, device="cpu", dtype=torch.bfloat16, packed=packed, max_batch=2)
    plain = Engine.load(path, device="cpu", dtype=torch.bfloat16, packed=packed, max_batch=2, prepack=False)
    converted = [m for m in fast.model.modules() if isinstance(m, PrepackedLinear)]
    plain_linears = [m for m in plain.model.modules() if type(m) is torch.nn.Linear]  # stacked ones, head
    assert len(converted) == len(plain_linears) == (1 if packed else 4 * len(fast.model.layers) + 1)
    assert isinstance(fast.model.head, PrepackedLinear) and type(plain.model.head) is torch.nn.Linear
    assert any("reordered once for oneDNN" in note for note in fast.notes)
    prompts, max_tokens = _prompts([6, 11], seed=9), [16, 12]
    assert _tokens(fast, prompts, max_tokens) == _tokens(plain, prompts, max_tokens)
    fp32 = Engine.load(path, device="cpu", dtype=torch.float32, max_batch=1)
    assert not any(isinstance(m, PrepackedLinear) for m in fp32.model.modules())


@pytest.mark.slow
@pytest.mark.skipif(not prepack_supported(), reason="oneDNN's bf16 linear is unavailable on this CPU")
def test_compiled_bf16_packed_engine_equals_eager(tmp_path):
    """What the benchmark runs fastest — bf16, packed int4 layers, the prepacked head, fp32 decode
    attention — compiled and eager, token for token."""
    path = write_snapshot(tmp_path / "t", nano("trilm", kv_heads=2), seed=10)
    prompts, max_tokens = [*_prompts([5, 9], seed=5), [17]], [6, 14, 5]
    eager = Engine.load(path, device="cpu", packed=True, max_batch=2)
    compiled = Engine.load(path, device="cpu", packed=True, max_batch=2, compile=True)
    assert _tokens(compiled, prompts, max_tokens) == _tokens(eager, prompts, max_tokens)
    assert compiled.compiled.failure is None, compiled.compiled.failure


@pytest.mark.slow
def test_compiled_engines_of_one_process_keep_their_own_graphs(tmp_path):
    """Guards check only a step's arguments, so each engine compiles its own copy of the step code: two
    engines whose models differ in structure (plain linears; packed layers), with caches of the same shape
    and dtype, each produce their own eager tokens, whichever compiled first. fp32, where compiled and eager
    agree token for token (in bf16 inductor keeps fused intermediates in fp32, eager rounds each to bf16)."""
    float_path = write_snapshot(tmp_path / "f", nano("floatlm", kv_heads=2), seed=12)
    tri_path = write_snapshot(tmp_path / "t", nano("trilm", kv_heads=2), seed=12)
    prompts, max_tokens = _prompts([5, 8], seed=6), [7, 9]
    kinds = [(float_path, False), (tri_path, True)]
    fp32 = torch.float32
    eager = [Engine.load(p, device="cpu", dtype=fp32, packed=k, max_batch=2) for p, k in kinds]
    engines = [
        Engine.load(p, device="cpu", dtype=fp32, packed=k, max_batch=2, compile=True) for p, k in kinds
    ]
    eager = [_tokens(e, prompts, max_tokens) for e in eager]
    assert engines[0].compiled._decode_fn is not engines[1].compiled._decode_fn
    packed = engines[1].model.linear_modules().values()
    assert all(fp32 in layer._cpu_state.dense for layer in packed)  # dequantized at load, not when traced
    assert [_tokens(e, prompts, max_tokens) for e in engines] == eager
    assert [e.compiled.failure for e in engines] == [None, None]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("masked", [True, False])
def test_decode_attention_matches_fp64_softmax(dtype, masked):
    """One query per sequence over the cache: bf16 on CPU takes the fp32 products (not SDPA's bf16 flash
    kernel), fp32 SDPA; both equal the fp64 softmax attention of the same cached values within the cast of
    the output to the cache dtype."""
    cfg = nano("floatlm", kv_heads=2)
    cache = KVCache(cfg, slots=2, max_len=20, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, hd = cfg.heads, 2, cfg.head_dim
    for t in (cache.keys[0], cache.values[0]):
        t.copy_(torch.randn(t.shape, generator=gen))
    positions = torch.tensor([12, 7] if masked else [12, 12])
    step = cache.decode(2, 13, positions, masked=masked)
    q = torch.randn(2, heads, 1, hd, generator=gen).to(dtype)
    k, v = (torch.randn(2, kv_heads, 1, hd, generator=gen).to(dtype) for _ in range(2))
    out = step.layer(0).attend(q, k, v)
    keys, values = cache.keys[0][:2, :, :13].double(), cache.values[0][:2, :, :13].double()
    scores = q.double().reshape(2, kv_heads, heads // kv_heads, hd) @ keys.transpose(-1, -2) * hd**-0.5
    if masked:
        scores[1, ..., 8:] = float("-inf")
    ref = (scores.softmax(-1) @ values).reshape(2, heads, 1, hd)
    tol = 2**-8 if dtype == torch.bfloat16 else 1e-5
    assert (out.double() - ref).abs().max() <= tol * (1 + ref.abs().max())


def test_packed_on_a_float_model_is_refused(tmp_path):
    path = write_snapshot(tmp_path / "f", nano("floatlm"), seed=6)
    with pytest.raises(
        ConfigError, match=r"packed: .* floatlm with float block weights only: nothing to pack"
    ):
        Engine.load(path, device="cpu", packed=True, max_batch=1)


def test_packed_cli_refuses_a_float_model_with_exit_2(tmp_path, tokenizer, capsys):
    from trilm.cli import main

    path = write_snapshot(tmp_path / "f", nano("floatlm"), tokenizer, seed=6)
    code = main(["generate", "--model", str(path), "--device", "cpu", "--packed", "--prompt", "a"])
    assert code == 2
    assert "nothing to pack" in capsys.readouterr().err


def test_thread_and_dtype_defaults():
    before = torch.get_num_threads()
    try:
        assert 1 <= available_cpus() <= (torch.multiprocessing.cpu_count() or 1)
        assert configure_threads(None) == available_cpus() == torch.get_num_threads()
        assert configure_threads(1) == 1 == torch.get_num_threads()
        with pytest.raises(ConfigError, match="threads: must be >= 1"):
            configure_threads(0)
    finally:
        torch.set_num_threads(before)
    cpu = torch.device("cpu")
    assert resolve_dtype(cpu, None) == torch.float32
    assert resolve_dtype(cpu, None, packed=True) == torch.bfloat16
    assert resolve_dtype(cpu, None, packed=True, backend="torch") == torch.float32
    assert resolve_dtype(cpu, torch.float16, packed=True) == torch.float16
