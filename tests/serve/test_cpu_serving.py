"""Serving on a CPU: compiled steps against eager ones, packed layers against dequantized ones, the defaults.

The compiled steps (``torch.compile``, inductor's C++ backend) compile once per batch bucket and once for the
prefill; they must produce the eager engine's tokens, token for token. ``packed=True`` on CPU runs the
block linears on torch's int4 kernel in bf16; the engine must produce the tokens of the same model with
its layers dequantized, in the same dtype.
"""

import pytest
import torch

from tests.serve.conftest import VOCAB, nano, random_state, write_snapshot
from trilm.config import ConfigError
from trilm.infer import from_state_dict
from trilm.serve import Engine, SamplingParams
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


def test_compile_is_refused_off_the_cpu():
    if not torch.cuda.is_available():
        cfg = nano("floatlm")
        model = from_state_dict(cfg, random_state(cfg, seed=1)).to("meta")
        with pytest.raises(ConfigError, match="compile"):
            Engine(model, max_batch=1, compile=True)


@pytest.mark.parametrize("family", ["trilm", "bilm"])
def test_packed_cpu_engine_equals_dequantized_engine(tmp_path, family):
    path = write_snapshot(tmp_path / family, nano(family, kv_heads=2), seed=5)
    packed = Engine.load(path, device="cpu", packed=True, max_batch=2)
    assert packed.dtype == torch.bfloat16  # the int4 CPU kernel's dtype
    layers = list(packed.model.linear_modules().values())
    assert all(layer._cpu_state is not None and layer._cpu_state.int4 is not None for layer in layers)
    dense = Engine.load(path, device="cpu", dtype=torch.bfloat16, max_batch=2)
    assert {type(m).__name__ for m in dense.model.linear_modules().values()} == {"Linear"}
    prompts, max_tokens = _prompts([6, 11], seed=4), [16, 12]
    assert _tokens(packed, prompts, max_tokens) == _tokens(dense, prompts, max_tokens)


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
