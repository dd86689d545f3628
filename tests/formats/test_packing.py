"""The int32-along-K bit layout: round trips, the exact bit positions, errors, popcount."""

import pytest
import torch

from trilm.formats.packing import pack_codes, packed_rows, popcount, unpack_codes


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("k", [1, 31, 33, 100])
def test_round_trip_odd_sizes(bits, k):
    codes = torch.randint(0, 1 << bits, (7, k), generator=torch.Generator().manual_seed(k))
    words = pack_codes(codes, bits)
    assert words.dtype == torch.int32 and words.shape == (packed_rows(k, bits), 7)
    assert torch.equal(unpack_codes(words, bits, k), codes.to(torch.uint8))


def test_layout_is_lsb_first_along_k_with_n_contiguous():
    codes = torch.zeros(2, 20, dtype=torch.int64)
    codes[0, 0] = 1  # row 0, k 0 → word 0, bits 0-1
    codes[0, 17] = 3  # row 0, k 17 → word 1, bits 2-3
    codes[1, 15] = 2  # row 1, k 15 → word 0, bits 30-31 (sign bit of the int32)
    words = pack_codes(codes, 2)
    assert words.shape == (2, 2)
    assert words[0, 0].item() == 1 and words[1, 0].item() == 3 << 2
    assert words[0, 1].item() == -(1 << 31) and words[1, 1].item() == 0


def test_rejects_out_of_range_and_bad_shapes():
    with pytest.raises(ValueError, match=r"codes must lie in \[0, 3\]"):
        pack_codes(torch.tensor([[4]]), 2)
    with pytest.raises(ValueError, match="bits must be one of"):
        pack_codes(torch.zeros(1, 3, dtype=torch.int64), 3)
    with pytest.raises(ValueError, match="need 2 packed rows"):
        unpack_codes(torch.zeros(3, 1, dtype=torch.int32), 2, 20)


def test_popcount_matches_python():
    v = torch.arange(1 << 16)
    expected = torch.tensor([bin(i).count("1") for i in range(1 << 16)])
    assert torch.equal(popcount(v).long(), expected)
