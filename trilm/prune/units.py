"""What a structural pruning unit is, how many a model has, and how many a keep ratio keeps.

Three granularities, each one score per unit:

- ``head``: one unit per **KV-head group** of a block (the KV head and the query heads that read it). Removing
  the group removes its rows of ``wq``/``wk``/``wv`` and its columns of ``wo``; a block whose groups are all
  removed loses its attention sub-block (``layer_kv_heads[i] = 0``).
- ``channel``: one unit per **MLP intermediate channel** (a row of ``w_gate`` and ``w_up``, a column of
  ``w_down``); a block whose channels are all removed loses its MLP (``layer_ffn[i] = 0``).
- ``layer``: one unit per **block**; a removed block is gone and the following blocks move up.

``keep`` is the fraction of units kept, over the whole model (pruning is global, so blocks end up with
different sizes): ``round(keep · units)`` units, at least one. For ``layer`` that is the fraction of blocks
kept: a 6-block model at keep 0.7 keeps round(4.2) = 4 blocks.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from trilm.config import ConfigError
from trilm.model.config import ModelConfig

GRANULARITIES = ("head", "channel", "layer")
SUB_BLOCK = {"head": "attention", "channel": "MLP", "layer": "block"}


@dataclasses.dataclass(frozen=True)
class UnitGroup:
    """The units of one granularity, block by block (0 where a block has none)."""

    granularity: str
    counts: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.counts)

    @property
    def offsets(self) -> list[int]:
        out, acc = [], 0
        for c in self.counts:
            out.append(acc)
            acc += c
        return out

    def split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """A flat per-unit tensor as one tensor per block (empty for blocks without units)."""
        return list(torch.split(flat, list(self.counts)))

    def unit_name(self, index: int) -> str:
        """``layers.3.kv1`` / ``layers.3.ffn17`` / ``layers.3`` for flat unit ``index`` (for messages)."""
        for layer, (start, count) in enumerate(zip(self.offsets, self.counts)):
            if start <= index < start + count:
                local = index - start
                if self.granularity == "head":
                    return f"layers.{layer}.kv{local}"
                if self.granularity == "channel":
                    return f"layers.{layer}.ffn{local}"
                return f"layers.{layer}"
        raise IndexError(index)


def check_keep(keep: float) -> float:
    if not isinstance(keep, int | float) or math.isnan(keep) or not 0 < keep <= 1:
        raise ConfigError(f"--keep: the keep ratio must be in (0, 1] (fraction of units kept), got {keep}")
    return float(keep)


def parse_granularity(text: str) -> tuple[str, ...]:
    """``head``, ``channel``, ``layer`` or ``head,channel`` (heads and channels pruned together, each group
    to its own budget, as the reference prunes attention and MLP)."""
    parts = tuple(p.strip() for p in str(text).split(",") if p.strip())
    unknown = [p for p in parts if p not in GRANULARITIES]
    if not parts or unknown:
        raise ConfigError(
            f"--granularity: {text!r} is not one of {', '.join(GRANULARITIES)} (or head,channel)"
        )
    if len(set(parts)) != len(parts):
        raise ConfigError(f"--granularity: {text!r} names a granularity twice")
    if "layer" in parts and len(parts) > 1:
        raise ConfigError("--granularity: layer pruning removes whole blocks and cannot be combined")
    return tuple(sorted(parts, key=GRANULARITIES.index))


def unit_group(cfg: ModelConfig, granularity: str) -> UnitGroup:
    """The units of ``cfg`` at one granularity; a granularity the model cannot support is a ConfigError."""
    shapes = cfg.layer_shapes()
    if granularity == "head":
        if cfg.num_kv_heads == 1:
            raise ConfigError(
                f"--granularity head: {cfg.name} has a single KV head per block (multi-query attention); "
                "head units are KV-head groups, so pruning one would remove a whole attention sub-block — "
                "use --granularity layer, or channel for the MLP"
            )
        counts = tuple(s.kv_heads for s in shapes)
    elif granularity == "channel":
        counts = tuple(s.ffn for s in shapes)
    elif granularity == "layer":
        if cfg.layers < 2:
            raise ConfigError(
                f"--granularity layer: {cfg.name} has {cfg.layers} block; nothing to choose from"
            )
        counts = (1,) * cfg.layers
    else:
        raise ConfigError(f"--granularity: unknown granularity {granularity!r}")
    if sum(counts) == 0:
        raise ConfigError(
            f"--granularity {granularity}: {cfg.name} has no {SUB_BLOCK[granularity]} units left to prune"
        )
    return UnitGroup(granularity, counts)


def kept_count(keep: float, total: int, what: str = "units") -> int:
    """Units kept at ratio ``keep`` out of ``total``: round(keep · total) (half up), refused if that is 0."""
    n = math.floor(keep * total + 0.5)
    if n < 1:
        raise ConfigError(
            f"--keep {keep}: keeps none of the {total} {what}; the smallest keep ratio for this model is "
            f"{1 / total:.4g}"
        )
    return min(n, total)
