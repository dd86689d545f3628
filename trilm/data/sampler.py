"""Deterministic, stateless batches: the order is a pure function of (seed, epoch, global sample index).

Global sample ``g`` is sequence ``perm_{seed, epoch}(g mod n)`` with ``epoch = g // n``; ``perm`` is a
keyed Feistel permutation of ``[0, n)`` (cycle-walking), so any rank computes any index in O(1) memory, with
no index file to build or ship, even for the ~300M sequences of SlimPajama. Step ``s`` of a run with global
batch ``B`` covers global samples ``[s*B, (s+1)*B)``; data-parallel rank ``r`` of ``R`` takes the
contiguous slice ``r*B/R ... (r+1)*B/R``. Resuming is therefore "continue at sample k", at any DP size, and
the only state worth saving is (fingerprint, seed, seq_len, samples consumed).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import numpy as np
import torch

from trilm.config import Config, require
from trilm.data.errors import DataError
from trilm.data.shards import TokenShards
from trilm.data.tokenizer import Tokenizer

_ROUNDS = 6
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """splitmix64's finaliser of ``x ^ key``: a cheap, well-mixing 64-bit round function."""
    x = x ^ key
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


class EpochPermutation:
    """A seeded bijection of ``[0, n)``: a balanced Feistel network on the next even power of two, with
    cycle-walking (re-apply while the value is ≥ n; fewer than 4 rounds expected since 2^bits < 4n)."""

    def __init__(self, n: int, seed: int, epoch: int):
        if n <= 0:
            raise DataError(f"cannot permute {n} sequences")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        bits += bits % 2
        self.half = np.uint64(bits // 2)
        self.mask = np.uint64((1 << (bits // 2)) - 1)
        state = np.random.SeedSequence([seed, epoch, 0x7472696C6D]).generate_state(_ROUNDS, dtype=np.uint64)
        self.keys = [np.uint64(k) for k in state]

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self.half, x & self.mask
        for key in self.keys:
            left, right = right, left ^ (_mix(right, key) & self.mask)
        return (left << self.half) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        x = self._encrypt(np.asarray(positions, dtype=np.uint64))
        n = np.uint64(self.n)
        outside = x >= n
        while outside.any():
            x[outside] = self._encrypt(x[outside])
            outside = x >= n
        return x.astype(np.int64)


class SequenceSampler:
    """Batches of packed ``seq_len + 1``-token sequences from a prepared split; see the module docstring."""

    def __init__(self, shards: TokenShards, seq_len: int, seed: int):
        self.shards, self.seq_len, self.seed = shards, int(seq_len), int(seed)
        self.num_sequences = shards.num_sequences(self.seq_len)
        if self.num_sequences <= 0:
            raise DataError(
                f"{shards.path}: {shards.num_tokens} tokens make no sequence of {seq_len + 1} tokens"
            )
        self._perms: dict[int, EpochPermutation] = {}

    @property
    def fingerprint(self) -> str:
        return self.shards.fingerprint

    def _perm(self, epoch: int) -> EpochPermutation:
        perm = self._perms.get(epoch)
        if perm is None:
            if len(self._perms) > 4:
                self._perms.clear()
            perm = self._perms[epoch] = EpochPermutation(self.num_sequences, self.seed, epoch)
        return perm

    def global_indices(self, first: int, count: int) -> np.ndarray:
        """Sequence indices of global samples ``first ... first + count - 1``."""
        g: np.ndarray = np.arange(first, first + count, dtype=np.int64)
        epochs, pos = np.divmod(g, self.num_sequences)
        out: np.ndarray = np.empty(count, np.int64)
        for epoch in np.unique(epochs):
            sel = epochs == epoch
            out[sel] = self._perm(int(epoch))(pos[sel])
        return out

    def global_index(self, g: int) -> int:
        return int(self.global_indices(int(g), 1)[0])

    def epoch(self, g: int) -> int:
        return int(g) // self.num_sequences

    def samples(self, indices: np.ndarray) -> torch.Tensor:
        rows = [self.shards.sequence(int(i), self.seq_len) for i in indices]
        if not rows:
            return torch.empty(0, self.seq_len + 1, dtype=torch.long)
        return torch.from_numpy(np.stack(rows))

    def rank_slice(self, first_sample: int, global_batch: int, dp_rank: int, dp_size: int) -> tuple[int, int]:
        """(first global sample, count) of this rank's part of the global batch from ``first_sample``."""
        if dp_size <= 0 or not 0 <= dp_rank < dp_size:
            raise DataError(f"dp_rank {dp_rank} outside [0, {dp_size})")
        if global_batch % dp_size:
            raise DataError(f"global batch {global_batch} is not divisible by data-parallel size {dp_size}")
        local = global_batch // dp_size
        return first_sample + dp_rank * local, local

    def batch_from(self, first_sample: int, global_batch: int, dp_rank: int = 0, dp_size: int = 1):
        """This rank's ``[global_batch // dp_size, seq_len + 1]`` LongTensor of global samples from
        ``first_sample``; for a resume at a global batch size that does not divide the samples consumed."""
        start, local = self.rank_slice(first_sample, global_batch, dp_rank, dp_size)
        return self.samples(self.global_indices(start, local))

    def batch(self, step: int, global_batch: int, dp_rank: int = 0, dp_size: int = 1) -> torch.Tensor:
        """This rank's rows of step ``step``: global samples ``[step*B, (step+1)*B)``, B = global_batch."""
        return self.batch_from(step * global_batch, global_batch, dp_rank, dp_size)

    def documents_of(self, step: int, global_batch: int) -> list[list[dict]]:
        """Per sample of a step: the documents (shard, number, source, token span) its tokens come from."""
        out = []
        for i in self.global_indices(step * global_batch, global_batch):
            start = int(i) * self.seq_len
            out.append(self.shards.documents_in(start, start + self.seq_len + 1))
        return out

    def state_dict(self, samples_consumed: int) -> dict:
        return {
            "fingerprint": self.fingerprint,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "num_sequences": self.num_sequences,
            "samples_consumed": int(samples_consumed),
        }

    def check_resume(self, state: dict) -> int:
        """Samples consumed by the saved run, after checking it read this very data in this order."""
        for key in ("fingerprint", "seed", "seq_len"):
            if key not in state:
                raise DataError(f"data state: missing {key!r} (not a SequenceSampler.state_dict)")
        if state["fingerprint"] != self.fingerprint:
            raise DataError(
                f"refusing to resume: the run was trained on data with fingerprint "
                f"{state['fingerprint'][:16]}…"
                f", but {self.shards.path} has fingerprint {self.fingerprint[:16]}… (content, order or "
                "tokenizer changed); resuming would silently change the data order"
            )
        for key in ("seed", "seq_len"):
            if int(state[key]) != getattr(self, key):
                raise DataError(f"refusing to resume: data {key} was {state[key]}, now {getattr(self, key)}")
        return int(state["samples_consumed"])


class ValidationSet:
    """A fixed set of validation sequences (all, or ``max_sequences`` evenly spaced), in a fixed order.

    ``batches(batch_size, dp_rank, dp_size)`` gives rank ``r`` the sequences ``r, r+R, r+2R, ...``; ranks
    then sum their loss and token counts (all-reduce) for the exact mean over the set.
    """

    def __init__(self, shards: TokenShards, seq_len: int, max_sequences: int = 0):
        self.shards, self.seq_len = shards, int(seq_len)
        n = shards.num_sequences(self.seq_len)
        if n <= 0:
            raise DataError(f"{shards.path}: too few tokens for one validation sequence of {seq_len + 1}")
        if max_sequences and max_sequences < n:
            self.indices = np.unique(np.linspace(0, n - 1, max_sequences).round().astype(np.int64))
        else:
            self.indices = np.arange(n, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.indices)

    def batches(self, batch_size: int, dp_rank: int = 0, dp_size: int = 1) -> Iterator[torch.Tensor]:
        mine = self.indices[dp_rank::dp_size]
        for lo in range(0, len(mine), batch_size):
            rows = [self.shards.sequence(int(i), self.seq_len) for i in mine[lo : lo + batch_size]]
            yield torch.from_numpy(np.stack(rows))


@dataclasses.dataclass
class Data:
    """What ``DataConfig.build`` returns: the tokenizer (if configured), train sampler, validation set."""

    tokenizer: Tokenizer | None
    train: SequenceSampler
    valid: ValidationSet | None


@dataclasses.dataclass
class DataConfig(Config):
    """Prepared splits and the sampling seed of a training run."""

    train_dir: str = ""
    valid_dir: str = ""  # empty: no validation loss
    tokenizer: str = ""  # .model path; when set, its hash must equal the shards'
    seed: int = 1234
    valid_sequences: int = 0  # 0: every validation sequence
    verify_checksums: bool = False
    """Re-hash every shard against its recorded SHA-256 when the run starts (reads all tokens once)."""

    def validate(self) -> None:
        require(bool(self.train_dir), "train_dir: the prepared train split directory is required")
        require(self.valid_sequences >= 0, "valid_sequences: must be >= 0")

    def build(self, seq_len: int) -> Data:
        train = TokenShards.open(self.train_dir, verify=self.verify_checksums)
        tok = None
        if self.tokenizer:
            tok = Tokenizer.load(self.tokenizer)
            if tok.hash != train.tokenizer_hash:
                raise DataError(
                    f"{self.train_dir}: prepared with tokenizer {train.tokenizer_hash[:16]}…, but "
                    f"{self.tokenizer} is {tok.hash[:16]}…"
                )
        valid = None
        if self.valid_dir:
            vshards = TokenShards.open(self.valid_dir, verify=self.verify_checksums)
            if vshards.tokenizer_hash != train.tokenizer_hash:
                raise DataError(
                    f"{self.valid_dir}: tokenizer {vshards.tokenizer_hash[:16]}… differs from the train "
                    f"split's {train.tokenizer_hash[:16]}… ({os.fspath(self.train_dir)})"
                )
            valid = ValidationSet(vshards, seq_len, self.valid_sequences)
        return Data(tok, SequenceSampler(train, seq_len, self.seed), valid)
