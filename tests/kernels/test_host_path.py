"""The host side of a QuantLinear call: one kernel launch, a plan built once, tuning results kept on disk.

The one-launch property is checked on CPU with two independent counters: Triton's interpreter entry point
(``InterpretedFunction.run``, every kernel launch goes through it) and the torch profiler's list of aten
ops run by the forward outside the kernels — on a GPU each of zero_/fill_/copy_/add would be a kernel of its
own. (For the profile the kernels are counted but not run: the interpreter's own tensor copies are not ops
the forward would issue on a GPU.)
"""

import json

import pytest
import torch
from trilm.kernels import QuantLinear, prepare, reference_matmul
from trilm.kernels.affine import plan as plans
from trilm.kernels.affine.tuning import GEMV_CANDIDATES, TuningCache
from triton.runtime.interpreter import InterpretedFunction

from trilm.formats.samples import random_packed

EXTRA_KERNEL_OPS = ("aten::zero_", "aten::zeros", "aten::fill_", "aten::copy_", "aten::_to_copy", "aten::add")


class Launches(list):
    """Names of the Triton kernels the interpreter was asked to run; ``execute=False`` skips running them."""

    execute = True


@pytest.fixture
def launches(monkeypatch):
    seen = Launches()
    original = InterpretedFunction.run

    def counting_run(self, *args, **kwargs):
        seen.append(self.fn.__name__)
        return original(self, *args, **kwargs) if seen.execute else None

    monkeypatch.setattr(InterpretedFunction, "run", counting_run)
    return seen


def aten_ops(fn, launches: Launches) -> list[str]:
    """The aten ops ``fn`` runs outside Triton kernels (kernels are counted in ``launches``, not run)."""
    launches.clear()
    launches.execute = False
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            fn()
    finally:
        launches.execute = True
    return [e.name for e in prof.events()]


@pytest.mark.parametrize(("kind", "m"), [("ternary", 1), ("binary_mean", 3), ("int4_act", 8), ("int3", 20)])
def test_one_launch_per_call(kind, m, launches):
    layer = QuantLinear(random_packed(kind, 96, 256, group_size=64, seed=1), torch.randn(96))
    x = torch.randn(m, 256)
    layer(x)  # builds the plan
    ops = aten_ops(lambda: layer(x), launches)
    assert len(launches) == 1 and launches[0].startswith("affine_"), launches
    extra = [op for op in ops if op in EXTRA_KERNEL_OPS]
    assert not extra, f"forward ran ops that are kernels of their own on a GPU: {extra}"


def test_split_k_call_is_still_one_launch(launches, monkeypatch):
    """With K split across programs the reduction happens in the same kernel (no zeroing, no cast)."""
    monkeypatch.setattr(
        "trilm.kernels.affine.tuning.AFFINE_INTERP_GEMV", {**GEMV_CANDIDATES[1][0], "SPLIT_K": 4}
    )
    layer = QuantLinear(random_packed("ternary", 64, 512, seed=2))
    x = torch.randn(1, 512)
    y = layer(x)
    assert next(iter(layer._plans.values())).split_k == 4
    ops = aten_ops(lambda: layer(x), launches)
    assert len(launches) == 1 and not [op for op in ops if op in EXTRA_KERNEL_OPS]
    ref = reference_matmul(x.double(), layer.packed, torch.float64)
    assert ((y.double() - ref).abs().max() / ref.abs().max()).item() <= 4e-6


def test_general_formats_are_not_one_launch_yet(launches):
    """N:M binary still runs zero + kernel + cast (documented in docs/kernels.md); this pins that fact."""
    layer = QuantLinear(random_packed("nm2:4", 64, 256, seed=3))
    x = torch.randn(1, 256)
    layer(x)
    ops = aten_ops(lambda: layer(x), launches)
    assert launches == ["gemv_kernel"] and "aten::zeros" in ops


def test_plan_is_built_once_per_rows_and_dtype(monkeypatch):
    layer = QuantLinear(random_packed("int4", 48, 128, seed=4))
    x1, x5 = torch.randn(1, 128), torch.randn(5, 128)
    layer(x1), layer(x5)
    assert set(layer._plans) == {(1, torch.float32, x1.device), (5, torch.float32, x1.device)}

    def no_new_plans(*args, **kwargs):
        raise AssertionError("a plan was resolved again at steady state")

    monkeypatch.setattr(plans, "make_plan", no_new_plans)
    layer(x1), layer(x5), layer(x5.view(5, 1, 128))
    layer.to(torch.float64)  # moving/casting a layer drops its plans (they hold its tensors)
    assert layer._plans == {}


def test_tuning_cache_round_trip(tmp_path):
    path = tmp_path / "tune" / "cache.json"
    cache = TuningCache(path)
    assert cache.get("k") is None
    cfg = {"BLOCK_R": 8, "BLOCK_N": 512, "num_warps": 4, "num_stages": 2}
    cache.put("NVIDIA H200|triton-3.6.0|gemv|ternary|N8192|K8192|G8192|M1|float16", cfg, 7.5)
    cache.save()
    again = TuningCache(path)
    assert again.get("NVIDIA H200|triton-3.6.0|gemv|ternary|N8192|K8192|G8192|M1|float16") == cfg
    assert json.loads(path.read_text())["version"] == 1 and not path.with_name("cache.json.tmp").exists()
    # a plan built from the stored config computes the same thing as one built from the literal config
    weight = random_packed("ternary", 64, 256, seed=6)
    spec = prepare(weight).affine
    x = torch.randn(1, 256)
    stored = plans.make_plan(spec, "gemv", 1, x.dtype, again.get(next(iter(again.entries))))(x)
    assert torch.equal(stored, plans.make_plan(spec, "gemv", 1, x.dtype, cfg)(x))


def test_tuning_cache_refuses_a_broken_file(tmp_path):
    path = tmp_path / "cache.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"cache\.json: kernel tuning cache is not valid JSON"):
        TuningCache(path)
    path.write_text(json.dumps({"version": 1, "entries": {"k": {"us": 1.0}}}))
    with pytest.raises(ValueError, match="field 'entries'"):
        TuningCache(path)


def test_tuning_key_names_everything_a_config_depends_on():
    spec = prepare(random_packed("int4_act", 64, 256, group_size=64)).affine
    key = plans.tuning_key(spec, "gemm", 20, torch.float16)
    assert key.startswith("cpu|triton-") and key.endswith("|gemm|int4+perm|N64|K256|G64|M32|float16")
