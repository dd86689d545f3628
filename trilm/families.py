"""The model families, written once: what a TriLM, a FloatLM and a BiLM are (no torch, so it stays light).

Each :class:`Family` says how its block linears store their weights (the ``trilm.formats`` name), how many
value bits a block weight carries (:mod:`trilm.bits`, the one definition of bit counts), the name people
write (TriLM) and a sentence for model cards. The model config, the CLI, exports, pruning, the results table
and the reports read these instead of keeping their own lists.

Results-table rows also carry post-hoc families by a naming convention, ``quantlm-<method>-<bits>``; the
functions below map any such name to its kind and bits.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any, Literal

from trilm.bits import BINARY_BITS, FLOAT_BITS, TERNARY_BITS, gptq_bits

WeightFormat = Literal["float", "ternary", "binary"]


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    """As configs and snapshots spell it: ``trilm``."""
    display: str
    """As people write it: ``TriLM``."""
    weight_format: WeightFormat
    """How its block linears hold their weights: ``ternary``, ``binary`` or ``float``."""
    linear_bits: float
    """Value bits per block-linear weight, as the papers count them (TriLM log2 3, BiLM 1, FloatLM 16)."""
    description: str
    """What the model is, completing "NAME is …" on a model card."""


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "trilm",
            "TriLM",
            "ternary",
            TERNARY_BITS,
            "a ternary LLaMA-style model (weights γ·{−1, 0, +1}, one absmean scale per tensor-parallel "
            "partition), trained with quantization-aware training and a straight-through estimator",
        ),
        Family(
            "floatlm",
            "FloatLM",
            "float",
            FLOAT_BITS,
            "a LLaMA-style model with float weights, the FloatLM baseline of the TriLM suite",
        ),
        Family(
            "bilm",
            "BiLM",
            "binary",
            BINARY_BITS,
            "a binary LLaMA-style model (weights γ·{−1, +1} per scale partition), trained with "
            "quantization-aware training",
        ),
    )
}
"""The trained families, in the order presets and reports list them."""
FAMILY_NAMES: tuple[str, ...] = tuple(FAMILIES)


def get_family(name: str) -> Family:
    """The family called ``name``; a KeyError naming the known ones otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown model family {name!r}; families: {', '.join(FAMILY_NAMES)}") from None


def display_name(family: str) -> str:
    """``TriLM`` for ``trilm`` (any case); other names as given (``quantlm-gptq-4``)."""
    known = FAMILIES.get(family.strip().lower())
    return known.display if known is not None else family


def family_kind(family: str) -> str:
    """``trilm``, ``floatlm``, ``bilm``, ``quantlm`` or ``other``, from a family name (any case)."""
    name = family.strip().lower()
    if name in FAMILIES:
        return name
    return "quantlm" if name.startswith("quantlm") else "other"


def family_linear_bits(family: str, group_size: int = 128) -> float | None:
    """Value bits per linear weight implied by a family name, or None.

    A trained family's :attr:`Family.linear_bits`; ``quantlm-<method>-<b>`` a GPTQ-style group quantizer
    (:func:`~trilm.bits.gptq_bits` with ``group_size``).
    """
    kind = family_kind(family)
    if kind in FAMILIES:
        return FAMILIES[kind].linear_bits
    if kind == "quantlm":
        match = re.search(r"-(\d+(?:\.\d+)?)(?:bit)?$", family.strip().lower())
        return gptq_bits(float(match.group(1)), group_size) if match else None
    return None


def snapshot_linear_bits(meta: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """(value bits, stored bits) per linear weight recorded in a snapshot's meta, or (family's, None).

    A QuantLM records both in ``extra["quant"]["bits"]`` (``paper``, ``stored``); a trained TriLM/BiLM/FloatLM
    is counted by its family.
    """
    quant = (meta.get("extra") or {}).get("quant") or {}
    bits = quant.get("bits") if isinstance(quant, Mapping) else None
    if isinstance(bits, Mapping):
        stored = bits.get("stored")
        paper = bits.get("paper")
        return (paper if paper is not None else stored), stored
    family = str(meta.get("family", ""))
    return family_linear_bits(family), None
