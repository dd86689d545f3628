"""The compact post-hoc layouts: bit streams, exact round trips, dequantize against the formula written out,
their kernel layouts, safetensors, errors naming the field, and stored bits against the minimum."""

import math

import pytest
import torch

from trilm.formats import (
    FormatError,
    MultiBinaryWeight,
    PartialBinaryWeight,
    PBLLMWeight,
    ResidualBinaryWeight,
    layer_bits,
    load_packed,
    model_bits_summary,
    save_packed,
    within_budget,
)
from trilm.formats.accounting import log2_binomial, nm_pattern_bits, subset_bits
from trilm.formats.bitstream import (
    SUBSET_CODINGS,
    decode_subset,
    digits_per_chunk,
    encode_subset,
    nm_rank,
    nm_rank_bits,
    nm_unrank,
    pack_bits,
    pack_digits,
    subset_code_bits,
    unpack_bits,
    unpack_digits,
)
from trilm.formats.residual import param_count

GEN = torch.Generator().manual_seed(7)


def rand(*shape):
    return torch.rand(shape, generator=GEN)


@pytest.mark.parametrize("width", [1, 3, 7, 8, 13, 33, 62])
def test_bit_stream_round_trip(width):
    hi = (1 << width) - 1
    values = (rand(1003) * hi).to(torch.int64)
    values[:3] = torch.tensor([0, hi, hi // 2])
    stream = pack_bits(values, width)
    assert stream.numel() == math.ceil(1003 * width / 8)
    assert torch.equal(unpack_bits(stream, width, 1003), values)
    with pytest.raises(ValueError, match="lie in"):
        pack_bits(torch.tensor([hi + 1]), width)


@pytest.mark.parametrize("radix", [2, 3, 5, 7])
def test_digit_stream_round_trip_and_density(radix):
    digits = (rand(2001) * radix).to(torch.int64)
    assert torch.equal(unpack_digits(pack_digits(digits, radix), radix, 2001), digits)
    d, bits = digits_per_chunk(radix)
    assert bits / d <= math.log2(radix) * 1.006


@pytest.mark.parametrize("density", [0.0, 0.003, 0.1, 0.3, 0.6, 0.97, 1.0])
def test_subsets_every_coding(density):
    member = rand(4099) < density
    n = int(member.sum())
    for coding in SUBSET_CODINGS:
        used, streams = encode_subset(member, coding)
        assert used == coding
        assert sum(t.numel() for t in streams.values()) * 8 == subset_code_bits(4099, n, coding)
        assert torch.equal(decode_subset(coding, streams, 4099, n), member)
    best, _ = encode_subset(member)
    assert subset_code_bits(4099, n, best) == min(subset_code_bits(4099, n, c) for c in SUBSET_CODINGS)
    assert subset_code_bits(4099, n, best) <= 1.1 * subset_bits(4099, n) + 0.05 * 4099


@pytest.mark.parametrize(("n", "m"), [(2, 4), (4, 8), (6, 8), (3, 8), (1, 16)])
def test_nm_ranks(n, m):
    keep = rand(5, 6, m).argsort(-1) < n
    keep = keep.reshape(5, 6 * m)
    ranks = nm_rank(keep, n, m)
    assert int(ranks.max()) < math.comb(m, n)
    assert torch.equal(nm_unrank(ranks, n, m), keep)
    assert nm_rank_bits(n, m) == math.ceil(math.log2(math.comb(m, n)))
    with pytest.raises(ValueError, match="keeps"):
        nm_rank(torch.ones(1, m, dtype=torch.bool), n, m)


def residual_output(n, k, *, block, order, groups, nm=None, salient_share=0.1, dtype=torch.float16):
    """A random BiLLM/STBLLM-shaped output: the inputs of ResidualBinaryWeight.pack."""
    sal = rand(k) < salient_share
    kept = None
    if nm:
        keep, m = nm
        kept = (rand(n, k // m, m).argsort(-1) < keep).reshape(n, k)
    signs = (rand(order, n, k) < 0.5).to(torch.int8) * 2 - 1
    gid = (rand(n, k) * groups).to(torch.int64)
    params = (rand(-(-k // block), param_count(order, groups), n) - 0.3).to(dtype)
    return {
        "salient_cols": sal,
        "signs": signs,
        "group_ids": gid,
        "params": params,
        "kept": kept,
        "block_size": block,
        "groups": groups,
        "nm_n": nm[0] if nm else 1,
        "nm_m": nm[1] if nm else 1,
    }


def residual_formula(o):
    """W[r, c] written out weight by weight from the pack inputs."""
    sal, signs, gid, params = o["salient_cols"], o["signs"], o["group_ids"], o["params"].double()
    order, n, k = signs.shape
    kept = o["kept"] if o["kept"] is not None else torch.ones(n, k, dtype=torch.bool)
    w = torch.zeros(n, k, dtype=torch.float64)
    for r in range(n):
        for c in range(k):
            if not kept[r, c]:
                continue
            p = params[c // o["block_size"], :, r]
            if sal[c]:
                w[r, c] = p[0] + sum(p[1 + q] * signs[q, r, c] for q in range(order))
            else:
                g = int(gid[r, c])
                w[r, c] = p[1 + order + 2 * g] + p[2 + order + 2 * g] * signs[0, r, c]
    return w


@pytest.mark.parametrize(
    ("order", "groups", "nm", "k", "block"),
    [
        (2, 2, None, 96, 32),
        (2, 3, (4, 8), 96, 32),
        (2, 3, (6, 8), 80, 48),
        (1, 1, (2, 4), 36, 16),
        (3, 2, None, 40, 40),
    ],
)
def test_residual_binary_round_trip(order, groups, nm, k, block):
    o = residual_output(11, k, block=block, order=order, groups=groups, nm=nm)
    w = ResidualBinaryWeight.pack(**o)
    assert torch.allclose(w.dequantize().double(), residual_formula(o), atol=1e-6)
    kept, sal, signs, gid = w.planes()
    assert torch.equal(sal, o["salient_cols"])
    if nm:
        assert torch.equal(kept, o["kept"])
        assert bool((w.dequantize()[~kept] == 0).all())
    assert torch.equal(signs[0][kept], o["signs"][0][kept])
    assert torch.equal(gid[kept & ~sal], o["group_ids"][kept & ~sal])
    layout = w.kernel_layout()
    assert isinstance(layout, MultiBinaryWeight)
    assert torch.equal(layout.dequantize(), w.dequantize())
    again = ResidualBinaryWeight.from_tensors(w.to_tensors(), w.meta())
    assert torch.equal(again.dequantize(), w.dequantize())


def test_residual_binary_bits_meet_the_budget():
    # BiLLM-shaped (2 groups, order 2, fp16 params, blocks of 128) and STBLLM 4:8 (3 groups).
    for groups, nm in ((2, None), (3, (4, 8)), (3, (6, 8))):
        o = residual_output(64, 512, block=128, order=2, groups=groups, nm=nm)
        w = ResidualBinaryWeight.pack(**o)
        bits = layer_bits(w)
        assert bits["minimum"] <= bits["stored"] and within_budget(bits["stored"], bits["minimum"]), bits
        keep = nm[0] / nm[1] if nm else 1.0
        share = w.salient_kept / w.kept
        assert bits["value"] == pytest.approx(keep * (2 * share + (1 - share)))


def test_minimum_parts_by_hand():
    # One 8×16 block, no N:M, 3 salient columns, two groups: count every part explicitly.
    o = residual_output(8, 16, block=16, order=2, groups=2, salient_share=0.0)
    o["salient_cols"][[1, 5, 9]] = True
    o["group_ids"][:, :] = 0
    o["group_ids"][0, 0] = 1
    w = ResidualBinaryWeight.pack(**o)
    signs = 8 * 16 + 8 * 3
    ids = 8 * 13 * 1.0
    cols = log2_binomial(16, 3) + math.log2(17)
    params = 8 * 3 + 8 * 2 + 1 * 2  # salient (μ, α0, α1) per row; group 0 in every row; group 1 in row 0
    assert w.minimum_bits() == pytest.approx(signs + ids + cols + params * 16)
    assert nm_pattern_bits(4, 8) == pytest.approx(math.log2(70) / 8)


def test_residual_binary_errors_name_the_field():
    o = residual_output(4, 32, block=16, order=2, groups=2)
    o["signs"][0, 0, 0] = 0
    with pytest.raises(FormatError, match="signs"):
        ResidualBinaryWeight.pack(**o)
    o = residual_output(4, 32, block=16, order=2, groups=2, nm=(4, 8))
    o["kept"][0, :8] = True
    with pytest.raises(FormatError, match="kept.*row 0, group 0"):
        ResidualBinaryWeight.pack(**o)
    w = ResidualBinaryWeight.pack(**residual_output(4, 32, block=16, order=2, groups=2))
    tensors = w.to_tensors()
    tensors["signs"] = tensors["signs"][:-1]
    with pytest.raises(FormatError, match="residual_binary.signs"):
        ResidualBinaryWeight.from_tensors(tensors, w.meta())


def partial_output(n, k, share, *, high_bits=8, dtype=torch.float16):
    mask = rand(n, k) < share
    return {
        "salient_mask": mask,
        "signs": (rand(n, k) < 0.5).to(torch.int8) * 2 - 1,
        "codes": (rand(n, k) * (1 << high_bits)).to(torch.int64),
        "alpha": (rand(n) + 0.1).to(dtype),
        "mu": (rand(n) - 0.5).to(dtype),
        "scale": (rand(n) * 0.01 + 1e-3).to(dtype),
        "zero": (rand(n) * (1 << high_bits)).floor(),
        "high_bits": high_bits,
    }


@pytest.mark.parametrize(
    ("share", "high_bits"), [(0.0, 8), (0.02, 8), (0.1, 8), (0.2, 4), (0.5, 8), (1.0, 8)]
)
def test_partial_binary_round_trip_and_budget(share, high_bits):
    o = partial_output(24, 200, share, high_bits=high_bits)
    w = PartialBinaryWeight.pack(**o)
    mask = o["salient_mask"]
    want = torch.where(
        mask,
        (o["codes"].double() - o["zero"].double()[:, None]) * o["scale"].double()[:, None],
        o["signs"].double() * o["alpha"].double()[:, None] + o["mu"].double()[:, None],
    )
    assert torch.allclose(w.dequantize().double(), want, atol=1e-6)
    assert torch.equal(w.salient_mask(), mask)
    layout = w.kernel_layout()
    assert isinstance(layout, PBLLMWeight) and torch.equal(layout.dequantize(), w.dequantize())
    bits = layer_bits(w)
    assert within_budget(bits["stored"], bits["minimum"]), bits


def test_partial_binary_value_bits_and_errors():
    o = partial_output(10, 100, 0.0)
    o["salient_mask"][:, :10] = True
    w = PartialBinaryWeight.pack(**o)
    assert w.value_bits() == pytest.approx(2.7)
    o["zero"][0] = 0.5
    with pytest.raises(FormatError, match="zero"):
        PartialBinaryWeight.pack(**o)
    tensors, meta = w.to_tensors(), w.meta()
    meta["salient"] = 99
    with pytest.raises(FormatError, match="partial_binary"):
        PartialBinaryWeight.from_tensors(tensors, meta)


def test_save_load_and_model_summary(tmp_path):
    res = ResidualBinaryWeight.pack(**residual_output(16, 64, block=32, order=2, groups=3, nm=(4, 8)))
    part = PartialBinaryWeight.pack(**partial_output(16, 64, 0.1))
    save_packed(tmp_path / "p.safetensors", {"a": res, "b": part})
    layers, _ = load_packed(tmp_path / "p.safetensors")
    assert torch.equal(layers["a"].dequantize(), res.dequantize())
    assert torch.equal(layers["b"].dequantize(), part.dequantize())
    summary = model_bits_summary(layers)
    per = [layer_bits(layers[n]) for n in ("a", "b")]
    assert summary["stored"] == pytest.approx(sum(p["stored"] for p in per) / 2)
    assert summary["minimum"] == pytest.approx(sum(p["minimum"] for p in per) / 2)
