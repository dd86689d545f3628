"""Converting a float model into a ternary or binary one by continued training, with and without a teacher."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trilm.config import ConfigError
from trilm.model.config import preset
from trilm.store.layout import WEIGHTS_FILE
from trilm.store.snapshot import read_snapshot_config, write_snapshot
from trilm.train.config import TrainConfig
from trilm.train.distill import kl_divergence
from trilm.train.init_from import resolve_init_from
from trilm.train.trainer import Trainer

from .conftest import tiny_config

STEPS = 12


@pytest.fixture(scope="module")
def float_model(prepared, tmp_path_factory) -> Path:
    """A FloatLM-nano trained for 24 steps: the model every conversion starts from and learns from."""
    run = tmp_path_factory.mktemp("float") / "run"
    Trainer(tiny_config(prepared, run, family="floatlm")).fit()
    return run / "snapshots" / "step-24"


def _conversion(prepared, run: Path, source: Path, family: str, teacher: Path | None, **extra) -> TrainConfig:
    base = tiny_config(prepared, run).to_dict()
    base.pop("model")
    data = {
        **base,
        "init_from": str(source),
        "model": {"family": family},
        "tokens": 1024 * STEPS,
        "checkpoint": {"snapshot_every": 4, "state_every": 4, "keep_last": 3, "log_spaced_until": 0},
        "log": {"every": 1, "eval_every": 0, "tensorboard": False, "progress": False},
        "convert": {"recipe": "as_written"},  # plain and distilled differ in the teacher alone
        **extra,
    }
    if teacher is not None:
        data["distill"] = {"teacher": str(teacher), "weight": 0.5, "temperature": 2.0}
    return TrainConfig.from_dict(data)


def _metrics(run: Path) -> list[dict]:
    lines = (run / "logs" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines if '"loss"' in x]


@pytest.fixture(scope="module")
def conversions(prepared, float_model, tmp_path_factory) -> dict[tuple[str, bool], tuple[Path, dict]]:
    """TriLM and BiLM converted from the FloatLM, with and without distillation: run dir, val losses."""
    out = {}
    for family in ("trilm", "bilm"):
        for distill in (False, True):
            run = tmp_path_factory.mktemp(f"{family}-{distill}") / "run"
            cfg = _conversion(prepared, run, float_model, family, float_model if distill else None)
            model = resolve_init_from(cfg).model  # the trainer resolves it the same way
            assert model.family == family and model.name == f"{family}-nano"
            out[family, distill] = run, Trainer(cfg).fit().val_losses
    return out


@pytest.mark.parametrize("family", ["trilm", "bilm"])
@pytest.mark.parametrize("distill", [False, True], ids=["plain", "distilled"])
def test_a_float_model_converts_and_its_loss_falls(float_model, conversions, family, distill):
    run, losses = conversions[family, distill]
    start = load_file(str(run / "snapshots" / "step-0" / WEIGHTS_FILE))
    source = load_file(str(float_model / WEIGHTS_FILE))
    assert start.keys() == source.keys()
    for name in source:  # the latent weights start as the float ones
        assert torch.equal(start[name], source[name]), name
    assert losses[STEPS] < losses[0] - 0.05, losses  # the quantized start recovers as it trains

    logged = _metrics(run)
    if distill:
        for row in logged:  # the logged loss is the configured mixture of the two terms
            mix = 0.5 * row["ce"] + 0.5 * 4.0 * row["distill_kl"]
            assert row["loss"] == pytest.approx(mix, rel=1e-5)
    else:
        assert not any("distill_kl" in row for row in logged)

    cfg, meta = read_snapshot_config(run / "snapshots" / f"step-{STEPS}")
    assert cfg.family == meta.family == family
    assert meta.extra["init_from"]["family"] == "floatlm"
    assert ("distill" in meta.extra) == distill


@pytest.mark.parametrize("family", ["trilm", "bilm"])
def test_distillation_keeps_the_student_closer_to_its_teacher(prepared, float_model, conversions, family):
    from trilm.data.shards import TokenShards
    from trilm.train.models import load_model

    shards = TokenShards.open(prepared["validation"])
    ids = torch.stack([torch.as_tensor(shards.sequence(i, 64)).long() for i in range(16)])
    teacher = load_model(float_model, tp=1).eval()
    with torch.no_grad():
        target = torch.log_softmax(teacher(ids)[..., :512].float() / 2.0, -1)
        kl = {}
        for distill in (False, True):
            run, _ = conversions[family, distill]
            student = load_model(run / "snapshots" / f"step-{STEPS}", tp=1).eval()
            kl[distill] = float(kl_divergence(target, torch.log_softmax(student(ids)[..., :512] / 2.0, -1)))
    assert kl[True] < kl[False], kl


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


def test_a_distilled_conversion_resumes_exactly(prepared, float_model, tmp_path):
    straight = _conversion(prepared, tmp_path / "straight", float_model, "trilm", float_model)
    Trainer(straight).fit()
    killed = _conversion(prepared, tmp_path / "killed", float_model, "trilm", float_model)
    with pytest.raises(_Killed):
        _DiesAtStep(killed, at=6).fit()
    summary = Trainer(killed).fit()
    assert summary.resumed_from == 4
    a = load_file(str(tmp_path / "straight/snapshots/step-12" / WEIGHTS_FILE))
    b = load_file(str(tmp_path / "killed/snapshots/step-12" / WEIGHTS_FILE))
    for name in a:
        assert torch.equal(a[name], b[name]), name


def _relabelled(source: Path, out: Path, **meta_changes) -> Path:
    """A copy of a snapshot whose meta claims another tokenizer (the weights stay valid)."""
    cfg, meta = read_snapshot_config(source)
    state = load_file(str(source / WEIGHTS_FILE))
    return write_snapshot(out, cfg, dataclasses.replace(meta, **meta_changes), state)


def test_a_teacher_with_another_vocabulary_or_tokenizer_is_refused(prepared, float_model, tmp_path):
    from trilm.model.build import build_model
    from trilm.train.models import save_model

    wider = build_model(preset("floatlm-nano", vocab_size=640), tp=1, seed=0)
    other_vocab = save_model(wider, tmp_path / "wider", {"step": 0, "tokens": 0})
    cfg = _conversion(prepared, tmp_path / "a", float_model, "trilm", other_vocab)
    with pytest.raises(ConfigError, match=r"distill\.teacher: .*wider has a vocabulary of 640 tokens"):
        Trainer(cfg)

    other_tokens = _relabelled(float_model, tmp_path / "relabelled", tokenizer_hash="0" * 64)
    cfg = _conversion(prepared, tmp_path / "b", float_model, "trilm", other_tokens)
    with pytest.raises(
        ConfigError, match=r"distill\.teacher: .*relabelled was trained with another tokenizer"
    ):
        Trainer(cfg)
    assert not (tmp_path / "b").exists()  # refused before anything was written


def test_init_from_another_architecture_is_still_refused(prepared, float_model, tmp_path):
    cfg = _conversion(
        prepared, tmp_path / "run", float_model, "trilm", None, model={"family": "trilm", "hidden": 128}
    )
    with pytest.raises(ConfigError, match="init_from: .* whose tensors differ from model"):
        resolve_init_from(cfg)
    with pytest.raises(ConfigError, match="init_from: .* whose tensors differ from model"):
        Trainer(cfg)
    assert not (tmp_path / "run").exists()


def test_a_conversion_keeps_what_its_source_records_about_the_tokenizer(prepared, float_model, tmp_path):
    """An imported model records llama.cpp's pre-tokenizer name, BOS use and the original ids; a model
    trained from it keeps them while the tokenizer is the same, and drops a GGUF record of another one."""
    cfg, meta = read_snapshot_config(float_model)
    assert meta.tokenizer_hash
    tokenizer = {"tokenizer_model": "gpt2", "tokenizer_pre": "smollm", "tokenizer_hash": meta.tokenizer_hash}
    ids = {"bos_token_id": 1, "eos_token_id": 2}
    runs = {}
    for name, recorded_hash in (("same", meta.tokenizer_hash), ("other", "0" * 16)):
        source = tmp_path / name / "source"
        gguf = {
            **tokenizer,
            "tokenizer_hash": recorded_hash,
            "file": "model.gguf",
            "tensor_types": {"F32": 3},
        }
        extra = {**meta.extra, "gguf": gguf, "add_bos": True, "hf": ids}
        write_snapshot(
            source, cfg, dataclasses.replace(meta, extra=extra), load_file(str(float_model / WEIGHTS_FILE))
        )
        run = tmp_path / name / "run"
        Trainer(_conversion(prepared, run, source, "trilm", None, tokens=1024 * 4)).fit()
        runs[name] = read_snapshot_config(run / "snapshots" / "step-4")[1].extra

    assert runs["same"]["gguf"] == tokenizer  # the import's file and tensor types describe the import only
    assert "gguf" not in runs["other"]
    for extra in runs.values():
        assert extra["add_bos"] is True and extra["hf"] == ids and extra["init_from"]["family"] == "floatlm"


def test_distill_settings_are_validated(prepared, float_model, tmp_path):
    with pytest.raises(ConfigError, match=r"distill\.weight: must be in \(0, 1\]"):
        _conversion(
            prepared, tmp_path / "run", float_model, "trilm", None, distill={"teacher": "x", "weight": 0}
        )


def test_kl_divergence_is_zero_for_equal_distributions_and_positive_otherwise():
    logits = torch.randn(3, 5, 11)
    log_p = torch.log_softmax(logits, -1)
    assert kl_divergence(log_p, log_p).abs() < 1e-6
    log_q = torch.log_softmax(logits + torch.randn_like(logits), -1)
    expected = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
    assert kl_divergence(log_p, log_q) == pytest.approx(float(expected), rel=1e-6)
    assert kl_divergence(log_p, log_q) > 0


def test_the_experiment_report_pairs_seeds_and_gives_t_intervals(tmp_path):
    """The ternarization report (run as its command): per-seed differences, 95 % t intervals."""
    import csv
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    losses = {"trilm": [4.10, 4.20, 4.00], "floatlm": [4.00, 4.05, 3.95], "trilm-conv": [4.05, 4.10, 3.90]}
    with (tmp_path / "results.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["run", "size", "seed", "arm", "fraction", "distill", "tokens", "val_loss", "seconds"]
        )
        for arm, values in losses.items():
            fraction = 0.25 if arm == "trilm-conv" else 0.0
            for seed, loss in enumerate(values, 1):
                writer.writerow([f"{arm}-{seed}", "64x2", seed, arm, fraction, 0, 524288, loss, 10.0])
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.train.ternarize_report", "--out", str(tmp_path)],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    arms = {a["arm"]: a for a in json.loads((tmp_path / "summary.json").read_text())["sizes"]["64x2"]["arms"]}
    diffs = [c - t for c, t in zip(losses["trilm-conv"], losses["trilm"], strict=True)]  # -0.05, -0.10, -0.10
    mean = sum(diffs) / 3
    sd = (sum((d - mean) ** 2 for d in diffs) / 2) ** 0.5
    assert arms["trilm-conv"]["vs_scratch"] == pytest.approx(mean)
    assert arms["trilm-conv"]["vs_scratch_half_width"] == pytest.approx(4.303 * sd / 3**0.5)
    assert arms["trilm"]["mean"] == pytest.approx(4.10)
    assert "FloatLM 75% → TriLM 25%" in (tmp_path / "README.md").read_text()
    assert (tmp_path / "ternarize.png").stat().st_size > 0


def _fit(cfg):
    return Trainer(cfg).fit().val_losses


@pytest.mark.distributed
@pytest.mark.slow
def test_a_distilled_conversion_under_tensor_parallelism_matches_one_process(prepared, float_model, tmp_path):
    from trilm.testing.cluster import run_distributed

    model = {"family": "trilm", "quant": {"partitions": 2}}  # the same scales at TP 1 and TP 2
    short = {"tokens": 1024 * 4, "model": model}
    one = _conversion(prepared, tmp_path / "tp1", float_model, "trilm", float_model, **short)
    two = _conversion(prepared, tmp_path / "tp2", float_model, "trilm", float_model, **short)
    two = two.with_overrides(["parallel.tensor_parallel=2"])
    Trainer(one).fit()
    run_distributed(_fit, 2, two)
    a, b = _metrics(tmp_path / "tp1"), _metrics(tmp_path / "tp2")
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b, strict=True):  # the teacher's and the student's logits gathered over the vocabulary
        for key in ("loss", "ce", "distill_kl"):
            assert y[key] == pytest.approx(x[key], rel=1e-3, abs=1e-5), (x["step"], key)
