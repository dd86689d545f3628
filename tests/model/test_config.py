import pytest

from trilm.config import ConfigError
from trilm.model.config import SPECTRA_PARAMS, ModelConfig, preset, preset_names
from trilm.model.flops import flops_per_token, parameter_counts


def test_unknown_key_names_key_and_suggests():
    with pytest.raises(ConfigError, match=r"unknown key 'hiden' \(did you mean 'hidden'\?\)"):
        ModelConfig.from_dict({"hiden": 64})
    with pytest.raises(ConfigError, match=r"unknown key 'quant.scale_grup'"):
        ModelConfig.from_dict({"quant": {"scale_grup": "row"}})


def test_hidden_not_divisible_by_heads():
    with pytest.raises(ConfigError, match="hidden: 100 is not divisible by heads=8"):
        ModelConfig(hidden=100, heads=8)


@pytest.mark.parametrize(
    ("fields", "tp", "message"),
    [
        (dict(hidden=96, heads=6, ffn=256), 4, r"tensor_parallel=4 does not divide model.heads=6"),
        (dict(hidden=64, heads=4, ffn=250), 4, r"tensor_parallel=4 does not divide model.ffn=250"),
        (
            dict(hidden=64, heads=4, ffn=256, vocab_size=102, pad_vocab_to=2),
            4,
            r"does not divide model.vocab",
        ),
        (dict(hidden=64, heads=4, kv_heads=2, ffn=256), 4, r"does not divide model.kv_heads=2"),
    ],
)
def test_tensor_parallel_must_divide(fields, tp, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**fields).check_tensor_parallel(tp)


def test_partitions_and_tp_must_divide_one_another():
    cfg = ModelConfig(hidden=96, heads=6, ffn=384, quant={"partitions": 3})
    with pytest.raises(ConfigError, match="partitions=3 and parallel.tensor_parallel=2"):
        cfg.check_tensor_parallel(2)


def test_bad_values_name_their_key():
    with pytest.raises(ConfigError, match="scale_group"):
        ModelConfig(quant={"scale_group": "blocks"})
    with pytest.raises(ConfigError, match="family"):
        ModelConfig.from_dict({"family": "quadlm"})
    with pytest.raises(ConfigError, match="layers: expected an integer"):
        ModelConfig.from_dict({"layers": "many"})
    with pytest.raises(ConfigError, match="kv_heads"):
        ModelConfig(hidden=64, heads=4, kv_heads=3)
    with pytest.raises(ConfigError, match="group size 48 does not divide hidden=64"):
        ModelConfig(hidden=64, heads=4, ffn=96, quant={"scale_group": "group:48"})


def test_yaml_round_trip_and_overrides(tmp_path):
    cfg = preset("trilm-tiny")
    path = tmp_path / "m.yaml"
    cfg.to_yaml(path)
    assert ModelConfig.from_yaml(path) == cfg
    changed = ModelConfig.from_yaml(path, ["layers=2", "quant.scale_group=row"])
    assert changed.layers == 2 and changed.quant.scale_group == "row"
    with pytest.raises(ConfigError, match=r"m.yaml: unknown key 'quant.bits'"):
        ModelConfig.from_yaml(path, ["quant.bits=2"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("hidden: 64\nheads: 5\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: hidden: 64 is not divisible by heads=5"):
        ModelConfig.from_yaml(bad)


@pytest.mark.parametrize("size", list(SPECTRA_PARAMS))
def test_spectra_parameter_counts_match_table(size):
    for family in ("trilm", "floatlm", "bilm"):
        counts = parameter_counts(preset(f"{family}-{size}"))
        assert abs(counts.total - SPECTRA_PARAMS[size]) / SPECTRA_PARAMS[size] < 0.01


def test_all_presets_valid():
    names = preset_names()
    assert {"trilm-99m", "floatlm-3.9b", "bilm-1.1b", "trilm-tiny"} <= set(names)
    for name in names:
        assert preset(name).name == name


def test_flops_hand_count():
    cfg = ModelConfig(vocab_size=128, pad_vocab_to=128, hidden=8, ffn=16, heads=2, layers=1, context=4)
    # q,k,v,o: 4·8·8 = 256; mlp 3·8·16 = 384; head 128·8 = 1024 → 1664 matmul params.
    # forward = 2·1664 + attention 4·layers·heads·head_dim·seq = 4·1·2·4·4 = 128 → 3456; training ×3.
    assert flops_per_token(cfg, training=False) == 3456
    assert flops_per_token(cfg) == 3 * 3456
    assert flops_per_token(cfg, seq_len=8, training=False) == 3456 + 128
