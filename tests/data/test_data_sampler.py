"""Sampler: order as a pure function of (seed, epoch, index), DP slicing, resume at any DP size, guards."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trilm.config import ConfigError
from trilm.data.errors import DataError
from trilm.data.sampler import DataConfig, EpochPermutation, SequenceSampler, ValidationSet
from trilm.data.shards import TokenShards

SEQ = 64


@pytest.fixture(scope="module")
def train(embedded) -> TokenShards:
    return TokenShards.open(embedded["train"])


@pytest.mark.parametrize("n", [1, 2, 3, 5, 64, 1000, 4097, 45_417])
def test_epoch_permutation_is_a_seeded_bijection(n):
    perm = EpochPermutation(n, seed=7, epoch=0)
    out = perm(np.arange(n))
    assert np.array_equal(np.sort(out), np.arange(n))
    assert np.array_equal(out, EpochPermutation(n, seed=7, epoch=0)(np.arange(n)))
    if n >= 64:
        assert not np.array_equal(out, EpochPermutation(n, seed=8, epoch=0)(np.arange(n)))
        assert not np.array_equal(out, EpochPermutation(n, seed=7, epoch=1)(np.arange(n)))
        assert np.mean(out == np.arange(n)) < 0.05  # actually shuffled
        assert np.array_equal(perm(np.arange(n)[::-1]), out[::-1])  # pure in the index


def test_sequences_are_strided_windows_of_seq_len_plus_one(train):
    n = train.num_sequences(SEQ)
    assert n == (train.num_tokens - 1) // SEQ
    a, b = train.sequence(10, SEQ), train.sequence(11, SEQ)
    assert len(a) == SEQ + 1 and a[-1] == b[0]
    assert np.array_equal(train.sequence(n - 1, SEQ), train.tokens((n - 1) * SEQ, n * SEQ + 1))
    boundary = int(train.offsets[1])  # a window that spans two shards reads both
    i = boundary // SEQ
    expected = np.concatenate(
        [np.asarray(train._shard(0)[i * SEQ :]), np.asarray(train._shard(1)[: (i + 1) * SEQ + 1 - boundary])]
    )
    assert np.array_equal(train.sequence(i, SEQ), expected)
    with pytest.raises(IndexError):
        train.sequence(n, SEQ)


def test_batches_follow_the_global_order_and_epochs(train):
    s = SequenceSampler(train, SEQ, seed=3)
    n = s.num_sequences
    b = s.batch(step=2, global_batch=8)
    assert b.dtype == torch.long and b.shape == (8, SEQ + 1)
    for row, g in enumerate(range(16, 24)):
        assert torch.equal(b[row], torch.from_numpy(train.sequence(s.global_index(g), SEQ)))
    epoch0 = s.global_indices(0, n)
    epoch1 = s.global_indices(n, n)
    assert np.array_equal(np.sort(epoch0), np.arange(n)) and np.array_equal(np.sort(epoch1), np.arange(n))
    assert not np.array_equal(epoch0, epoch1) and s.epoch(n) == 1
    across = s.global_indices(n - 3, 6)  # one request straddling the epoch boundary
    assert np.array_equal(across, np.concatenate([epoch0[-3:], epoch1[:3]]))


def test_dp_ranks_partition_each_global_batch(train):
    s = SequenceSampler(train, SEQ, seed=11)
    whole = s.batch(5, 16)
    for dp in (2, 4, 8):
        parts = [s.batch(5, 16, dp_rank=r, dp_size=dp) for r in range(dp)]
        assert all(p.shape == (16 // dp, SEQ + 1) for p in parts)
        assert torch.equal(torch.cat(parts), whole)
    with pytest.raises(DataError, match="not divisible"):
        s.batch(0, 10, dp_rank=0, dp_size=4)
    with pytest.raises(DataError, match="dp_rank"):
        s.batch(0, 8, dp_rank=2, dp_size=2)


def test_resume_gives_identical_batches_at_same_and_different_dp_size(embedded):
    gb, k, m = 8, 5, 4
    first = SequenceSampler(TokenShards.open(embedded["train"]), SEQ, seed=1234)
    uninterrupted = [torch.cat([first.batch(step, gb, r, 2) for r in range(2)]) for step in range(k + m)]
    state = first.state_dict(samples_consumed=k * gb)  # what the trainer saves after step k-1 at dp=2

    for dp in (2, 1, 4):  # a fresh process: reopen everything, then continue where the state says
        again = SequenceSampler(TokenShards.open(embedded["train"]), SEQ, seed=1234)
        consumed = again.check_resume(state)
        assert consumed == k * gb
        for i in range(m):
            rows = [again.batch_from(consumed + i * gb, gb, r, dp) for r in range(dp)]
            assert torch.equal(torch.cat(rows), uninterrupted[k + i])

    # resuming with a different global batch continues at the same sample
    again = SequenceSampler(TokenShards.open(embedded["train"]), SEQ, seed=1234)
    bigger = again.batch_from(again.check_resume(state), 2 * gb)
    assert torch.equal(bigger, torch.cat(uninterrupted[k : k + 2]))


def test_resume_refuses_other_data_or_order(embedded, train):
    state = SequenceSampler(train, SEQ, seed=1).state_dict(80)
    other = SequenceSampler(TokenShards.open(embedded["validation"]), SEQ, seed=1)
    with pytest.raises(DataError, match="refusing to resume: the run was trained on data with fingerprint"):
        other.check_resume(state)
    with pytest.raises(DataError, match="seed was 1, now 2"):
        SequenceSampler(train, SEQ, seed=2).check_resume(state)
    with pytest.raises(DataError, match="seq_len was 64, now 32"):
        SequenceSampler(train, 32, seed=1).check_resume(state)
    with pytest.raises(DataError, match="missing 'fingerprint'"):
        other.check_resume({"seed": 1})


def test_validation_set_is_fixed_and_split_over_ranks(embedded):
    shards = TokenShards.open(embedded["validation"])
    full = ValidationSet(shards, SEQ)
    assert len(full) == shards.num_sequences(SEQ)
    some = ValidationSet(shards, SEQ, max_sequences=50)
    assert len(some) == 50 and some.indices[0] == 0 and some.indices[-1] == len(full) - 1
    one = torch.cat(list(some.batches(batch_size=8)))
    assert one.shape == (50, SEQ + 1)
    assert torch.equal(one, torch.cat(list(ValidationSet(shards, SEQ, 50).batches(batch_size=16))))
    ranked = [torch.cat(list(some.batches(8, dp_rank=r, dp_size=3))) for r in range(3)]
    assert sum(len(x) for x in ranked) == 50
    assert torch.equal(ranked[1][0], one[1]) and torch.equal(ranked[2][1], one[5])


def test_data_config_builds_and_checks_tokenizer(embedded, tmp_path):
    cfg = DataConfig.from_dict(
        {"train_dir": str(embedded["train"]), "valid_dir": str(embedded["validation"]),
         "tokenizer": str(embedded["tokenizer"]), "seed": 5, "valid_sequences": 10}
    )  # fmt: skip
    data = cfg.build(seq_len=SEQ)
    assert (
        data.train.seed == 5
        and len(data.valid) == 10
        and data.tokenizer.hash == data.train.shards.tokenizer_hash
    )
    assert data.tokenizer.padded_vocab_size(128) == 2048
    from trilm.data.tokenizer import train_tokenizer

    other = train_tokenizer(["some other text to learn from"] * 50, tmp_path / "o.model", vocab_size=300)
    with pytest.raises(DataError, match="prepared with tokenizer"):
        cfg.replace(tokenizer=str(other.path)).build(SEQ)
    with pytest.raises(ConfigError, match="train_dir"):
        DataConfig()
    with pytest.raises(ConfigError, match="unknown key 'sed'"):
        DataConfig.from_dict({"train_dir": "x", "sed": 1})
