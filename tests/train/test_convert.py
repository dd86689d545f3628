"""Conversion branches and the conversion recipe's levers (``TrainConfig.convert``): a WSD FloatLM's state
continued as a TriLM, the λ ramp, the optimizer moments kept or reset, the rate relative to the float
run's, warm-up 0, and the refusals of recipes that cannot apply."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from safetensors.torch import load_file

from trilm.config import ConfigError
from trilm.model.build import build_model
from trilm.model.config import preset
from trilm.model.quant import ScaleLayout, quantize, quantized_linear, set_ramp
from trilm.parallel import shutdown_parallel
from trilm.schedule import Schedule, ScheduleConfig
from trilm.store.layout import WEIGHTS_FILE
from trilm.store.snapshot import read_snapshot_config
from trilm.train.config import OptimConfig
from trilm.train.convert import ConvertConfig, ramp_lambda
from trilm.train.distill import Teacher, kl_divergence
from trilm.train.plan import RunPlan
from trilm.train.state import resolve_branch_from
from trilm.train.trainer import Trainer

from .conftest import tiny_config

WSD = {"schedule.kind": "wsd", "schedule.warmup": 2, "schedule.cooldown": 0.25, "optim.min_lr_ratio": 0.0}
START = 24
"""Where the parent's cooldown starts: 32 steps, the last quarter cooling down."""
PHASE = {"schedule.kind": "decay", "schedule.warmup": 0, "schedule.decay": "cosine"}
"""The conversion's own schedule: no warm-up, cosine to 0 over its 8 steps (ParetoQ's shape)."""


def _fit(cfg):
    try:
        return Trainer(cfg).fit()
    finally:
        shutdown_parallel()


def _weights(run_dir, step):
    return load_file(str(run_dir / "snapshots" / f"step-{step}" / WEIGHTS_FILE))


def _metrics(run_dir) -> list[dict]:
    lines = (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines if '"loss"' in x]


@pytest.fixture(scope="module")
def parent(prepared, tmp_path_factory):
    """A 32-step WSD FloatLM whose state (and snapshot) at its cooldown start, step 24, is kept."""
    root = tmp_path_factory.mktemp("float-parent") / "floatlm"
    cfg = tiny_config(
        prepared, root, "floatlm", tokens=1024 * 32, **WSD, **{"checkpoint.keep_states_at": f"[{START}]"}
    )
    _fit(cfg)
    return root


def _branch(prepared, run_dir, parent, **extra):
    """The parent continued as a TriLM from its cooldown start to its end (8 steps, every step logged)."""
    settings = {**WSD, **PHASE, "log.every": 1, "branch_from": str(parent / "state" / f"step-{START}")}
    return tiny_config(prepared, run_dir, "trilm", **{"tokens": 1024 * 32, **settings, **extra})


class _Killed(RuntimeError):
    pass


class _DiesAtStep(Trainer):
    """A trainer that fails in the middle of a step, after it has written a state: a kill, in-process."""

    def __init__(self, cfg, at: int):
        super().__init__(cfg)
        self.at = at

    def _micro_loss(self, engine, step, chunk):
        if step == self.at:
            raise _Killed(f"killed in step {step}")
        return super()._micro_loss(engine, step, chunk)


def test_a_conversion_branch_starts_from_the_float_state_and_resumes_exactly(prepared, parent, tmp_path):
    straight = _branch(prepared, tmp_path / "straight", parent)
    summary = _fit(straight)
    assert summary.resumed_from == START
    rows = _metrics(tmp_path / "straight")
    assert rows[0]["step"] == START + 1 and rows[0]["lr"] == pytest.approx(3e-3)  # no warm-up, the peak
    assert rows[-1]["step"] == 32 and rows[-1]["lr"] < 3e-3 * 0.05  # cosine to 0 over the phase
    _, meta = read_snapshot_config(tmp_path / "straight" / "snapshots" / "step-32")
    conversion = meta.extra["conversion"]
    assert meta.family == "trilm" and conversion["from"] == "floatlm" and conversion["start"] == START
    assert conversion["recipe"]["optimizer"] == "keep" and meta.extra["branch"]["step"] == START
    events = (tmp_path / "straight" / "logs" / "events.jsonl").read_text().splitlines()
    logged = [e for e in map(json.loads, events) if e["event"] == "conversion"]
    assert len(logged) == 1 and logged[0]["step"] == START and "floatlm → trilm" in logged[0]["detail"]
    teacher = str(parent / "snapshots" / f"step-{START}")  # the crossover recipe distils from the parent
    assert f"crossover: peak 1 × optim.lr, weight decay 0, distillation from {teacher}" in logged[0]["detail"]
    assert meta.extra["distill"] == {"teacher": teacher, "weight": 0.5, "temperature": 1.0}

    killed = _branch(prepared, tmp_path / "killed", parent)
    with pytest.raises(_Killed):
        try:
            _DiesAtStep(killed, at=30).fit()
        finally:
            shutdown_parallel()
    resumed = _fit(killed)
    assert resumed.resumed_from == 28  # its own state, not the parent's
    a, b = _weights(tmp_path / "straight", 32), _weights(tmp_path / "killed", 32)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.val_losses[32] == summary.val_losses[32]


def _first_update(prepared, parent, run_dir, optimizer: str | None):
    """|Δw| / lr of every block matrix entry over the branch's first step (no weight decay)."""
    extra = {"optim.weight_decay": 0.0, "checkpoint.snapshot_every": 1, "tokens": 1024 * (START + 2)}
    if optimizer is not None:
        extra["convert.optimizer"] = optimizer
    rows = _fit(_branch(prepared, run_dir, parent, **extra))
    assert rows.resumed_from == START
    lr = _metrics(run_dir)[0]["lr"]
    before, after = _weights(parent, START), _weights(run_dir, START + 1)
    ratios = [
        ((after[k] - before[k]).abs() / lr).flatten()
        for k in before
        if k.startswith("layers.") and before[k].dim() == 2
    ]
    return torch.cat(ratios)


def test_reset_moments_make_the_first_update_adams_first_step(prepared, parent, tmp_path):
    """A fresh AdamW's first update is lr·g/(|g| + eps): no entry moves by more than lr, and those with
    |g| ≫ eps (most) move by lr. With the float run's moments kept an entry moves by lr·m̂/(√v̂ + eps),
    another number for most entries. (The 1e-4 is fp32 rounding of w ± lr, far above for |w| ≤ 1.)"""
    reset = _first_update(prepared, parent, tmp_path / "reset", "reset")
    kept = _first_update(prepared, parent, tmp_path / "kept", None)
    at_lr = lambda r: float(((r - 1).abs() < 1e-3).float().mean())  # noqa: E731
    assert float(reset.max()) < 1 + 1e-4 and float(reset.median()) > 0.999, (reset.max(), reset.median())
    assert at_lr(reset) > 0.9, at_lr(reset)
    assert at_lr(kept) < 0.2, at_lr(kept)


def test_lr_scale_is_relative_to_the_float_runs_rate(prepared, parent, tmp_path):
    cfg = _branch(
        prepared, tmp_path / "run", parent, **{"convert.lr_scale": 0.25, "tokens": 1024 * (START + 2)}
    )
    plan = RunPlan(resolve_branch_from(cfg), dp_size=1, tp_size=1).report()  # as the dry run resolves it
    assert "peak 0.00075, warmup 0 steps, cosine to 0 (the conversion's, from step 24)" in plan
    _fit(cfg)
    assert _metrics(tmp_path / "run")[0]["lr"] == pytest.approx(0.25 * 3e-3)

    other_rate = _branch(prepared, tmp_path / "other", parent, **{"optim.lr": 1e-3})
    with pytest.raises(ConfigError, match=r"differs from this run in optim\.lr; a conversion branch"):
        _fit(other_rate)


def test_the_ramp_phases_quantization_in_over_its_share(prepared, parent, tmp_path):
    cfg = _branch(prepared, tmp_path / "run", parent, **{"convert.ramp": 0.5})  # 4 of the 8 steps
    _fit(cfg)
    assert [r["ramp"] for r in _metrics(tmp_path / "run")] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0]
    _, meta = read_snapshot_config(tmp_path / "run" / "snapshots" / "step-32")
    assert meta.extra["conversion"]["recipe"]["ramp"] == 0.5


def test_ramp_endpoints_are_the_float_and_the_ternary_model():
    """λ = 0 is the float model's logits bit for bit, λ = 1 the TriLM's; in between, the blend."""
    torch.manual_seed(0)
    float_model = build_model(preset("floatlm-nano", vocab_size=512), tp=1, seed=3).eval()
    ternary = build_model(preset("trilm-nano", vocab_size=512), tp=1, seed=3).eval()
    ternary.load_state_dict(float_model.state_dict())
    ids = torch.randint(0, 512, (2, 16))
    try:
        with torch.no_grad():
            reference_float = float_model(ids)
            reference_ternary = ternary(ids)
            set_ramp(0.0)
            assert torch.equal(ternary(ids), reference_float)
            set_ramp(0.5)
            half = ternary(ids)
            assert not torch.equal(half, reference_float) and not torch.equal(half, reference_ternary)
            set_ramp(1.0)
            assert torch.equal(ternary(ids), reference_ternary)
    finally:
        set_ramp(None)
    assert not torch.equal(reference_float, reference_ternary)


def test_the_ramp_blends_one_layer_and_keeps_the_straight_through_gradient():
    torch.manual_seed(1)
    layout = ScaleLayout(fmt="ternary")
    w = torch.randn(8, 16, requires_grad=True)
    x = torch.randn(4, 16)
    q, _ = quantize(w.detach(), layout)
    grads = []
    try:
        for lam in (0.3, None):
            set_ramp(lam)
            y = quantized_linear(x, w, layout)
            blended = w.detach() + (0.3 if lam else 1.0) * (q - w.detach())
            assert torch.allclose(y, x @ blended.t(), rtol=1e-5, atol=1e-6)
            (grad,) = torch.autograd.grad(y.square().sum(), w)
            grads.append((grad, 2 * y.detach().t() @ x))
    finally:
        set_ramp(None)
    for grad, expected in grads:  # ∂L/∂W = ∂L/∂W_λ = gᵀx whatever λ
        assert torch.allclose(grad, expected, rtol=1e-5, atol=1e-5)


def test_ramp_shapes():
    linear = ConvertConfig(ramp=0.5)
    assert [ramp_lambda(linear, s, 8) for s in range(6)] == [0.0, 0.25, 0.5, 0.75, None, None]
    assert ramp_lambda(ConvertConfig(), 0, 8) is None  # no ramp: W̃ from the first step
    sigmoid = ConvertConfig(ramp=0.5, ramp_shape="sigmoid", ramp_steepness=10.0)
    values = [ramp_lambda(sigmoid, s, 200) for s in range(100)]
    assert values[0] == 0.0 and ramp_lambda(sigmoid, 100, 200) is None
    assert all(a < b for a, b in itertools.pairwise(values))
    assert values[50] == pytest.approx(0.5, abs=1e-12)  # symmetric about the ramp's middle
    assert values[10] < 10 / 100  # flatter than the linear ramp at its start


def test_a_phase_schedule_starts_at_the_branch_point_and_warmup_0_is_the_peak_at_once():
    optim = OptimConfig(lr=4e-3, min_lr_ratio=0.0, weight_decay=0.1)
    phase = ScheduleConfig(kind="decay", warmup=0, decay="cosine", weight_decay_off_at=0.5)
    s = Schedule.for_optimizer(optim, phase, 100, start=80, lr_scale=0.25)
    assert s.lr(80) == pytest.approx(1e-3)  # the first step of the phase, at 0.25 × the run's rate
    assert s.lr(90) == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert s.weight_decay(89) == 0.1 and s.weight_decay(90) == 0.0  # events at fractions of the phase
    with pytest.raises(ValueError, match="before this schedule's phase"):
        s.lr(79)
    warm = Schedule.for_optimizer(optim, phase.replace(warmup=4), 100, start=80)
    assert [warm.lr(80 + i) for i in range(5)] == pytest.approx([1e-3, 2e-3, 3e-3, 4e-3, 4e-3])


def test_distillation_temperature_5_softens_both_distributions_and_scales_by_t_squared():
    """BitDistill's τ = 5: the loss is (1 − w)·CE + w·τ²·KL(softmax(t/τ) ‖ softmax(s/τ))."""
    torch.manual_seed(2)
    teacher_logits, student_logits = torch.randn(2, 5, 32), torch.randn(2, 5, 32)
    labels = torch.randint(0, 32, (2, 5))
    teacher = Teacher(torch.nn.Identity(), 32, temperature=5.0, weight=0.5)
    target = torch.log_softmax(teacher_logits / 5.0, -1)
    total, ce, kl = teacher.loss(student_logits, labels, target)
    expected_kl = kl_divergence(target, torch.log_softmax(student_logits / 5.0, -1))
    expected_ce = torch.nn.functional.cross_entropy(student_logits.flatten(0, 1), labels.flatten())
    assert kl == pytest.approx(float(expected_kl), rel=1e-6) and ce == pytest.approx(float(expected_ce))
    assert total == pytest.approx(float(0.5 * expected_ce + 0.5 * 25.0 * expected_kl), rel=1e-6)
    softer = kl_divergence(torch.log_softmax(teacher_logits, -1), torch.log_softmax(student_logits, -1))
    assert expected_kl < softer  # τ = 5 flattens both distributions, so they differ less


def test_recipes_that_cannot_apply_are_refused_by_key(prepared, parent, tmp_path):
    with pytest.raises(ConfigError, match=r"convert: a recipe for a conversion, but this run starts from"):
        tiny_config(prepared, tmp_path / "a", **{"convert.ramp": 0.1})
    with pytest.raises(ConfigError, match=r"convert\.ramp: a share of the conversion's steps in \[0, 1\)"):
        tiny_config(prepared, tmp_path / "b", **{"convert.ramp": 1.0})
    with pytest.raises(ConfigError, match=r"convert\.lr_scale: must be > 0"):
        tiny_config(prepared, tmp_path / "c", **{"convert.lr_scale": 0})
    with pytest.raises(ConfigError, match=r"convert\.ramp_shape: 'cubic' is not one of"):
        tiny_config(prepared, tmp_path / "d", **{"convert.ramp_shape": "cubic"})
    snapshot = str(parent / "snapshots" / f"step-{START}")
    with pytest.raises(ConfigError, match=r"convert\.optimizer: keep needs a state"):
        tiny_config(prepared, tmp_path / "e", init_from=snapshot, **{"convert.optimizer": "keep"})
    with pytest.raises(ConfigError, match=r"convert\.ramp: phases in the quantized weights only"):
        _branch(prepared, tmp_path / "f", parent, **{"convert.ramp": 0.1, "model.quant.activation_bits": 8})
    same_family = tiny_config(
        prepared,
        tmp_path / "g",
        "floatlm",
        tokens=1024 * 32,
        **WSD,
        branch_from=str(parent / "state" / f"step-{START}"),
        **{"convert.lr_scale": 0.5},
    )
    with pytest.raises(ConfigError, match=r"differs from this run in convert\.lr_scale; a branch continues"):
        _fit(same_family)


def test_reset_moments_reaches_adamw_under_zero_1(prepared, tmp_path):
    """Under ZeRO the moments live in DeepSpeed's partitioned optimizer: reset finds the AdamW inside it,
    zeroes its moments and step count, and the next step starts them again as a fresh optimizer's."""
    from trilm.model.transformer import Decoder
    from trilm.parallel import init_parallel
    from trilm.train.convert import reset_moments
    from trilm.train.engine import build_engine, prepare_model

    cfg = tiny_config(prepared, tmp_path / "run", zero_stage=1)
    info = init_parallel(cfg.parallel)
    try:
        model = Decoder(cfg.model.resolved(1), info, seed=0)
        prepare_model(model, cfg)
        engine = build_engine(model, cfg, cfg.accumulation(1), info)
        ids = torch.randint(0, 512, (8, 65), generator=torch.Generator().manual_seed(0))

        def step():
            engine.backward(engine(ids[:, :-1], labels=ids[:, 1:]).mean())
            engine.step()

        def states():
            return list(engine.optimizer.optimizer.state.values())

        step()
        assert states() and all(float(s["exp_avg"].abs().sum()) > 0 for s in states())
        assert reset_moments(engine) == len(states())
        for s in states():
            assert float(s["step"]) == 0 and not s["exp_avg"].any() and not s["exp_avg_sq"].any()
        step()
        assert all(float(s["step"]) == 1 for s in states())
    finally:
        shutdown_parallel()
