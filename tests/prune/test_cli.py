"""``trilm prune`` end to end: the written snapshot, what it records, and every kind of bad input."""

import json

import pytest
import torch

from trilm.formats import IntWeight
from trilm.infer import load_inference_model, load_with_meta
from trilm.model import parameter_counts
from trilm.model.snapshot import SnapshotMeta
from trilm.prune.masks import UnitMasks
from trilm.prune.units import unit_group
from trilm.store.hf import write_hf_files
from trilm.store.snapshot import read_snapshot_config, write_snapshot
from trilm.train.models import load_model, save_model

from .conftest import FAST_PG, cli, tiny_model


def _ids(vocab=512):
    return torch.randint(0, vocab, (2, 20), generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize(
    ("method", "granularity", "keep"),
    [("pg", "channel", 0.6), ("pg", "head,channel", 0.5), ("pg", "layer", 0.67), ("wanda", "head", 0.5)],
)
def test_prune_writes_a_smaller_snapshot_equal_to_the_masked_model(
    tmp_path, calib_snapshot, prepared, method, granularity, keep
):
    out = tmp_path / "pruned"
    with pytest.raises(SystemExit):  # argparse: --out is required
        cli(calib_snapshot, "--method", method, "--granularity", granularity, "--keep", keep)
    code = cli(
        calib_snapshot, "--method", method, "--granularity", granularity, "--keep", keep,
        "--calib", prepared["train"], "--out", out, *FAST_PG,
    )  # fmt: skip
    assert code == 0
    cfg, meta = read_snapshot_config(out)
    record = meta.extra["pruning"]
    assert record["method"] == method and record["keep"] == keep
    assert record["granularity"] == granularity.replace(",", "+")
    assert record["calibration"]["source"] == str(prepared["train"])
    assert meta.params == parameter_counts(cfg).total == record["params_after"] < record["params_before"]
    assert (out / "tokenizer.model").is_file()

    dense, _ = load_with_meta(calib_snapshot)
    groups = [unit_group(dense.cfg, g) for g in granularity.split(",")]
    masks = {}
    for group in groups:
        units = record["units"][group.granularity]
        assert units["kept"] == round(keep * group.total)
        flat = torch.zeros(group.total)
        for layer, indices in enumerate(units["kept_indices"]):
            flat[[group.offsets[layer] + i for i in indices]] = 1.0
        masks[group.granularity] = flat
    small = load_inference_model(out)
    decoder = load_model(out, tp=1)
    with torch.no_grad():
        with UnitMasks(dense, groups) as hooks:
            hooks.set(masks)
            masked = dense(_ids())
        served = small(_ids())
        trained = decoder(_ids())
    assert (served - masked).abs().max() <= 1e-5
    assert (trained - served).abs().max() <= 1e-5


def test_magnitude_needs_no_calibration_and_files_are_complete(tmp_path, calib_snapshot):
    out = tmp_path / "mag"
    assert (
        cli(calib_snapshot, "--method", "magnitude", "--granularity", "channel", "--keep", 0.5, "--out", out)
        == 0
    )
    assert sorted(p.name for p in out.iterdir()) == [
        "COMPLETE",
        "config.json",
        "model.safetensors",
        "tokenizer.model",
    ]
    assert not list(tmp_path.glob(".mag.tmp-*"))
    assert json.loads((out / "config.json").read_text())["meta"]["extra"]["pruning"]["calibration"] is None


@pytest.mark.parametrize(("granularity", "keep"), [("head,channel", 0.5), ("layer", 0.67)])
def test_pruned_snapshot_is_served_by_the_engine(tmp_path, calib_snapshot, prepared, granularity, keep):
    """The smaller model (per-layer shapes, or fewer blocks) through the serving engine's KV cache and
    continuous batching decodes exactly what greedy decoding with its plain forward gives."""
    from trilm.serve import Engine, SamplingParams

    out = tmp_path / "pruned"
    method = "block-importance" if granularity == "layer" else "wanda"
    argv = ["--method", method, "--granularity", granularity, "--keep", keep, "--calib", prepared["train"]]
    assert cli(calib_snapshot, *argv, "--out", out) == 0
    cfg, _ = read_snapshot_config(out)
    dense_cfg, _ = read_snapshot_config(calib_snapshot)
    assert parameter_counts(cfg).total < parameter_counts(dense_cfg).total
    engine = Engine.load(out, device="cpu", max_batch=2)
    vocab = dense_cfg.vocab_size
    prompts = [_ids(vocab)[0, :n].tolist() for n in (7, 13, 4)]
    handles = [
        engine.submit(p, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)) for p in prompts
    ]
    for prompt, handle in zip(prompts, handles):
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(6):
                ids.append(int(engine.model(torch.tensor([ids]))[0, -1, :vocab].argmax()))
        assert handle.result().token_ids == ids[len(prompt) :]


def _expect_error(capsys, tmp_path, match, *argv):
    out = tmp_path / "never"
    code = cli(*argv, "--out", out)
    err = capsys.readouterr().err
    assert code == 2, err
    assert match in err, err
    assert "Traceback" not in err
    assert not out.exists() and not list(tmp_path.glob(".never.tmp-*"))


@pytest.mark.parametrize("keep", ["0", "-0.5", "1.5", "nan"])
def test_keep_outside_the_unit_interval_is_refused(capsys, tmp_path, calib_snapshot, prepared, keep):
    _expect_error(
        capsys, tmp_path, "--keep: the keep ratio must be in (0, 1]",
        calib_snapshot, "--granularity", "channel", "--keep", keep, "--calib", prepared["train"],
    )  # fmt: skip


BAD_REQUESTS = [
    ("--granularity: 'heads' is not one of", ["--granularity", "heads", "--keep", ".5"]),
    ("keeps none of the 6 head units", ["--granularity", "head", "--keep", ".05"]),
    (
        "--method block-importance scores layer units, not channels",
        ["--method", "block-importance", "--granularity", "channel", "--keep", ".5"],
    ),
    (
        "--method wanda scores head, channel units, not layers",
        ["--method", "wanda", "--granularity", "layer"],
    ),
    ("layer pruning removes whole blocks", ["--granularity", "layer,head", "--keep", ".5"]),
    ("--per-layer: layer pruning has one unit per block", ["--granularity", "layer", "--per-layer"]),
]


@pytest.mark.parametrize(("match", "argv"), BAD_REQUESTS)
def test_bad_requests_are_clear_errors(capsys, tmp_path, calib_snapshot, prepared, match, argv):
    if "--keep" not in argv:
        argv = [*argv, "--keep", ".5"]
    _expect_error(capsys, tmp_path, match, calib_snapshot, *argv, "--calib", prepared["train"])


def test_missing_inputs_and_a_used_output_are_refused(capsys, tmp_path, calib_snapshot, prepared):
    channel = ("--granularity", "channel", "--keep", ".5")
    _expect_error(
        capsys,
        tmp_path,
        "--calib: method wanda needs calibration data",
        calib_snapshot,
        "--method",
        "wanda",
        *channel,
    )
    _expect_error(
        capsys,
        tmp_path,
        "missing.txt: no such file",
        calib_snapshot,
        *channel,
        "--calib",
        tmp_path / "missing.txt",
    )
    _expect_error(
        capsys, tmp_path, "not a directory", tmp_path / "nothing", *channel, "--calib", prepared["train"]
    )
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    code = cli(calib_snapshot, *channel, "--calib", prepared["train"], "--out", existing)
    assert code == 2 and "already exists and is not empty" in capsys.readouterr().err
    assert (existing / "keep.txt").read_text() == "mine"


def test_unsupported_granularities_are_refused(capsys, tmp_path, prepared):
    calib = ("--calib", prepared["train"])
    mqa, _, _ = tiny_model(kv_heads=1, vocab_size=512)
    save_model(mqa, tmp_path / "mqa", meta={"family": "floatlm"})
    head = ("--granularity", "head", "--keep", ".5", *calib)
    _expect_error(capsys, tmp_path, "single KV head per block", tmp_path / "mqa", *head)
    one, _, _ = tiny_model(layers=1, vocab_size=512)
    save_model(one, tmp_path / "one", meta={"family": "floatlm"})
    layer = ("--granularity", "layer", "--keep", ".5", *calib)
    _expect_error(capsys, tmp_path, "has 1 block; nothing to choose from", tmp_path / "one", *layer)


def test_calibration_data_too_short_is_named(capsys, tmp_path, calib_snapshot):
    text = tmp_path / "short.txt"
    text.write_text("A few words of text.")
    code = cli(
        calib_snapshot, "--granularity", "channel", "--keep", ".5", "--calib", text, "--out", tmp_path / "x"
    )
    err = capsys.readouterr().err
    assert code == 2 and f"{text}:" in err and "windows of" in err  # names the file, says what it holds
    assert not (tmp_path / "x").exists()


def test_a_packed_quantlm_is_not_a_model_pruning_applies_to(capsys, tmp_path, prepared):
    train, state, _ = tiny_model(vocab_size=512)
    packed = {
        n.removesuffix(".weight"): IntWeight.from_float(state[n], bits=4, group_size=64)
        for n in state
        if n.startswith("layers.") and "norm" not in n
    }
    rest = {k: v for k, v in state.items() if k.removesuffix(".weight") not in packed}
    meta = SnapshotMeta(family="floatlm", extra={"quant": {"method": "gptq", "bits": 4}})
    write_snapshot(tmp_path / "q", train.cfg, meta, rest, packed)
    channel = ("--granularity", "channel", "--keep", ".5", "--calib", prepared["train"])
    _expect_error(capsys, tmp_path, "gptq QuantLM", tmp_path / "q", *channel)


def test_prunes_a_hugging_face_directory(tmp_path, prepared):

    _, state, dense = tiny_model(vocab_size=512)
    write_hf_files(dense.cfg, state, tmp_path / "hf")
    out = tmp_path / "pruned"
    layer = ("--granularity", "layer", "--keep", ".67", "--calib", prepared["train"])
    code = cli(tmp_path / "hf", *layer, "--out", out, *FAST_PG)
    assert code == 0
    cfg, meta = read_snapshot_config(out)
    assert cfg.layers == 2 and meta.imported_from == str(tmp_path / "hf")
    assert load_inference_model(out).cfg.layers == 2
