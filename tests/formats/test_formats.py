"""Each format: exact round trip of its codes, dequantize against the format's formula written out directly,
tensors/meta and safetensors round trips, storage bits per weight, and errors that name the field."""

import pytest
import torch

from trilm.formats import (
    BinaryWeight,
    FormatError,
    IntWeight,
    MultiBinaryWeight,
    NMBinaryWeight,
    PBLLMWeight,
    ResidualGroup,
    TernaryWeight,
    from_tensors,
    load_packed,
    partition_scales,
    residual_value,
    save_packed,
)

GEN = torch.Generator().manual_seed(0)


def randint(lo, hi, shape):
    return torch.randint(lo, hi, shape, generator=GEN)


def rand(*shape):
    return torch.rand(shape, generator=GEN)


def nm_codes(n, k, keep, m):
    idx = rand(n, k // m, m).topk(keep, dim=-1).indices
    codes = torch.zeros(n, k // m, m, dtype=torch.int64)
    codes.scatter_(-1, idx, randint(0, 2, (n, k // m, keep)) * 2 - 1)
    return codes.reshape(n, k)


def per_weight(table, k):
    """(K // g, N) → (N, K), written independently of the codec's helper."""
    g = k // table.shape[0]
    return torch.stack([table[kk // g] for kk in range(k)], dim=1).double()


def test_ternary_round_trip_and_formula():
    codes = randint(-1, 2, (9, 50))
    scales = rand(5, 9) + 0.1
    w = TernaryWeight.pack(codes, scales)
    assert torch.equal(w.codes().long(), codes) and w.group_size == 10
    assert torch.allclose(w.dequantize().double(), codes.double() * per_weight(scales, 50))


def test_ternary_partition_scales_column_and_row_parallel():
    col = partition_scales(torch.tensor([1.0, 2.0, 3.0]), 6, 4, axis="out")
    assert col.shape == (1, 6) and col.flatten().tolist() == [1, 1, 2, 2, 3, 3]
    row = partition_scales(torch.tensor([1.0, 2.0]), 3, 8, axis="in")
    assert row.shape == (2, 3) and row[:, 0].tolist() == [1, 2]
    w = TernaryWeight.pack(torch.ones(3, 8, dtype=torch.int8), row)
    assert w.dequantize()[0].tolist() == [1.0] * 4 + [2.0] * 4
    with pytest.raises(FormatError, match="3 partitions do not divide out_features=4"):
        partition_scales(torch.ones(3), 4, 4, axis="out")


def test_binary_with_and_without_means():
    signs = randint(0, 2, (6, 70)) * 2 - 1
    scales, means = rand(2, 6), rand(2, 6) - 0.5
    plain = BinaryWeight.pack(signs, scales)
    assert torch.equal(plain.signs().long(), signs)
    assert torch.allclose(plain.dequantize().double(), signs * per_weight(scales, 70))
    centred = BinaryWeight.pack(signs > 0, scales, means)  # bool signs: True = +1
    expected = signs * per_weight(scales, 70) + per_weight(means, 70)
    assert torch.allclose(centred.dequantize().double(), expected)
    with pytest.raises(FormatError, match=r"binary\.signs: values must be -1 or"):
        BinaryWeight.pack(torch.zeros(2, 4, dtype=torch.int64), torch.ones(1, 2))


@pytest.mark.parametrize(("keep", "m"), [(2, 4), (4, 8), (1, 4), (2, 8), (8, 16)])
def test_nm_compressed_round_trip_and_ternary_form(keep, m):
    codes = nm_codes(11, 64, keep, m)
    scales = rand(2, 11) + 0.5
    w = NMBinaryWeight.pack(codes, scales, keep, m)
    assert torch.equal(w.codes().long(), codes)
    ternary = w.to_ternary()
    assert torch.equal(ternary.dequantize(), w.dequantize())
    back = NMBinaryWeight.from_ternary(ternary, keep, m)
    assert torch.equal(back.mask, w.mask) and torch.equal(back.signs, w.signs)
    sign_words = -(-(64 // m * keep) // 32)  # sign slots are padded to whole int32 words per row
    assert w.bits_per_weight() == pytest.approx(1 + sign_words * 32 / 64 + 32 * 2 / 64)


def test_nm_allows_fewer_kept_and_names_the_offending_group():
    codes = nm_codes(3, 16, 2, 4)
    codes[1, 4:8] = 0  # a group with nothing kept is still a valid 2:4 group
    assert torch.equal(NMBinaryWeight.pack(codes, torch.ones(1, 3), 2, 4).codes().long(), codes)
    codes[2, 8:12] = torch.tensor([1, -1, 1, 0])
    with pytest.raises(FormatError, match=r"row 2, group 2 \(inputs 8..11\) has 3 non-zeros"):
        NMBinaryWeight.pack(codes, torch.ones(1, 3), 2, 4)
    with pytest.raises(FormatError, match="store such a pattern as TernaryWeight"):
        NMBinaryWeight.pack(nm_codes(2, 16, 2, 8), torch.ones(1, 2), 6, 8)


def billm_like(n, k, block):
    groups = [ResidualGroup(1, 0), ResidualGroup(1, 0), ResidualGroup(2, 1)]
    col_class = (rand(k) < 0.2).long()
    gid = torch.where(col_class.bool().unsqueeze(0), 2, randint(0, 2, (n, k)))
    nb = -(-k // block)
    alpha = rand(nb, 3, 2, n)
    alpha[:, :2, 1] = 0
    return (randint(0, 2, (2, n, k)) * 2 - 1, gid, alpha, rand(nb, 3, n) - 0.5, groups, col_class)


def test_multibinary_matches_residual_sum_billm_and_stbllm():
    signs, gid, alpha, mu, groups, col_class = billm_like(10, 100, 32)
    w = MultiBinaryWeight.from_residual(signs, gid, alpha, mu, groups, col_class, 32, lut_dtype=torch.float32)
    assert w.n_bits == 2 and w.n_classes == 2 and w.n_blocks == 4
    assert torch.allclose(w.dequantize(), residual_value(signs, gid, alpha, mu, groups, 32), atol=1e-6)
    # STBLLM-like: a pruned group (order 0, μ = 0) per class and three non-salient groups → 3 bits
    st_groups = [ResidualGroup(0, 0), *[ResidualGroup(1, 0)] * 3, ResidualGroup(0, 1), ResidualGroup(2, 1)]
    kept = nm_codes(10, 96, 4, 8) != 0
    cls = (rand(96) < 0.2).long()
    gid = torch.where(
        cls.bool().unsqueeze(0), torch.where(kept, 5, 4), torch.where(kept, randint(1, 4, (10, 96)), 0)
    )
    alpha, mu = rand(1, 6, 2, 10), rand(1, 6, 10)
    alpha[:, [0, 4]] = 0
    mu[:, [0, 4]] = 0
    signs = randint(0, 2, (2, 10, 96)) * 2 - 1
    st = MultiBinaryWeight.from_residual(signs, gid, alpha, mu, st_groups, cls, 96, lut_dtype=torch.float32)
    dense = st.dequantize()
    assert st.n_bits == 3
    assert torch.allclose(dense, residual_value(signs, gid, alpha, mu, st_groups, 96), atol=1e-6)
    assert torch.equal(dense == 0, ~kept)  # N:M zeros survive packing


def test_multibinary_rejects_group_in_wrong_column_class():
    signs, gid, alpha, mu, groups, col_class = billm_like(4, 40, 40)
    c = int(torch.nonzero(col_class == 0)[0])
    gid[1, c] = 2
    with pytest.raises(
        FormatError, match=rf"weight \(1, {c}\) is in group 2 of class 1 but column {c} is class 0"
    ):
        MultiBinaryWeight.from_residual(signs, gid, alpha, mu, groups, col_class, 40)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_int_round_trip_with_and_without_act_order(bits):
    n, k, g = 8, 96, 32
    codes = randint(0, 1 << bits, (n, k))
    scales, zeros = rand(k // g, n) + 0.1, randint(0, 1 << bits, (k // g, n)).float()
    plain = IntWeight.pack(codes, scales, zeros, bits, scale_dtype=torch.float32)
    assert torch.equal(plain.codes().long(), codes)
    assert torch.allclose(plain.dequantize().double(), per_weight(scales, k) * (codes - per_weight(zeros, k)))
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[torch.randperm(k, generator=GEN)] = torch.arange(k, dtype=torch.int32) // g
    act = IntWeight.pack(codes, scales, zeros, bits, g_idx=g_idx, scale_dtype=torch.float32)
    assert torch.equal(act.codes().long(), codes)
    col_scale = scales.double()[g_idx.long()].t()
    col_zero = zeros.double()[g_idx.long()].t()
    assert torch.allclose(act.dequantize().double(), col_scale * (codes - col_zero))
    assert torch.equal(act.stored_codes()[:, act.perm.argsort()].long(), codes)


def test_int_errors_name_the_field():
    codes = randint(0, 8, (4, 64))
    with pytest.raises(FormatError, match=r"int.codes: values must be in \[0, 3\]"):
        IntWeight.pack(codes, torch.ones(2, 4), torch.zeros(2, 4), 2)
    with pytest.raises(FormatError, match="must appear exactly 32 times"):
        IntWeight.pack(
            codes, torch.ones(2, 4), torch.zeros(2, 4), 3, g_idx=torch.zeros(64, dtype=torch.int32)
        )
    with pytest.raises(FormatError, match="zero points must be integers"):
        IntWeight.pack(codes, torch.ones(2, 4), torch.full((2, 4), 0.5), 3)


def pbllm_sample(n=12, k=80):
    signs = randint(0, 2, (n, k)) * 2 - 1
    alpha, mu = rand(1, n) + 0.1, rand(1, n) - 0.5
    mask = rand(n, k) < 0.15
    q = randint(0, 256, (n, k))
    s8, z8 = rand(n) * 0.01, randint(0, 256, (n,))
    return PBLLMWeight.pack(signs, alpha, mu, mask, q, s8, z8), signs, alpha, mu, mask, q, s8, z8


def test_pbllm_binary_plus_salient():
    w, signs, alpha, mu, mask, q, s8, z8 = pbllm_sample()
    expected = signs * per_weight(alpha, 80) + per_weight(mu, 80)
    salient = (q.double() - z8.double().unsqueeze(1)) * s8.double().unsqueeze(1)
    expected = torch.where(mask, salient, expected)
    assert torch.allclose(w.dequantize().double(), expected, atol=1e-6)
    assert w.nnz == int(mask.sum()) and w.col.dtype == torch.int16
    assert w.bits_per_weight() == pytest.approx(w.storage_bits() / (12 * 80))


def samples():
    codes = randint(-1, 2, (6, 64))
    signs, gid, alpha, mu, groups, col_class = billm_like(6, 64, 32)
    return [
        TernaryWeight.pack(codes, rand(2, 6)),
        BinaryWeight.pack(randint(0, 2, (6, 64)) * 2 - 1, rand(1, 6), rand(1, 6)),
        NMBinaryWeight.pack(nm_codes(6, 64, 2, 4), rand(1, 6), 2, 4),
        MultiBinaryWeight.from_residual(signs, gid, alpha, mu, groups, col_class, 32),
        IntWeight.pack(
            randint(0, 8, (6, 64)), rand(2, 6), randint(0, 8, (2, 6)), 3, g_idx=torch.arange(64) % 2
        ),
        pbllm_sample(6, 64)[0],
    ]


def test_tensors_meta_and_file_round_trip(tmp_path):
    layers = {f"layers.{i}.proj": w for i, w in enumerate(samples())}
    for w in layers.values():
        again = from_tensors(w.to_tensors(), w.meta())
        assert type(again) is type(w) and torch.equal(again.dequantize(), w.dequantize())
        assert w.meta()["bits_per_weight"] == pytest.approx(w.bits_per_weight(), abs=1e-6)
    path = tmp_path / "packed.safetensors"
    save_packed(path, layers, {"method": "unit-test"})
    loaded, meta = load_packed(path)
    assert meta == {"method": "unit-test"} and sorted(loaded) == sorted(layers)
    for name, w in layers.items():
        assert torch.equal(loaded[name].dequantize(), w.dequantize())
        assert loaded[name].meta() == w.meta()
    assert not list(tmp_path.glob("*.tmp"))


def test_from_tensors_errors():
    w = samples()[0]
    tensors = w.to_tensors()
    with pytest.raises(FormatError, match="unknown packed format 'trinary'"):
        from_tensors(tensors, {**w.meta(), "format": "trinary"})
    with pytest.raises(FormatError, match=r"missing tensor\(s\) \['scales'\]"):
        from_tensors({"qweight": tensors["qweight"]}, w.meta())
    with pytest.raises(FormatError, match=r"ternary.qweight: expected int32 of shape \(4, 6\)"):
        from_tensors({**tensors, "qweight": tensors["qweight"][:3]}, w.meta())


def test_load_packed_rejects_a_plain_safetensors_file(tmp_path):
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(FormatError, match="not a trilm packed file"):
        load_packed(tmp_path / "plain.safetensors")


def test_storage_bits_of_the_documented_examples():
    k, n = 8192, 64
    tern = TernaryWeight.pack(torch.zeros(n, k, dtype=torch.int8), torch.ones(1, n))
    assert tern.bits_per_weight() == pytest.approx(2 + 32 / k)
    int4 = IntWeight.pack(
        torch.zeros(n, k, dtype=torch.uint8), torch.ones(k // 128, n), torch.zeros(k // 128, n), 4
    )
    assert int4.bits_per_weight() == pytest.approx(4 + (16 + 8) / 128)
    nm = NMBinaryWeight.pack(torch.zeros(n, k, dtype=torch.int8), torch.ones(1, n), 2, 4)
    assert nm.bits_per_weight() == pytest.approx(1.5 + 32 / k)
