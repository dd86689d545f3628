"""Shared pieces of the untrusted-file tests: Hypothesis settings and the check that an error is named.

Every reader of a file a user hands trilm must answer a damaged file with one of trilm's own exceptions,
naming the file, never with the exception of whatever library or ``struct`` call tripped first.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
"""Modest and reproducible: each property runs in seconds on two shared cores and never writes a database."""


def named(call: Callable[[], Any], error: type[Exception], path: Path, *, must_fail: bool) -> Any:
    """Run ``call``; an exception must be ``error`` and name ``path`` (any other type — IndexError, KeyError,
    struct.error, UnicodeDecodeError, MemoryError — propagates and fails the test). Returns what ``call``
    returned, or the exception; when ``must_fail``, returning normally is itself a failure."""
    try:
        result = call()
    except error as exc:
        assert str(path) in str(exc), f"the error does not name the file: {exc}"
        return exc
    if must_fail:
        raise AssertionError(f"{path}: a damaged file was read without an error")
    return result


def flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def truncated_or_flipped(data: Any, raw: bytes, *, max_flips: int = 3) -> bytes:
    """Draw from Hypothesis' ``data`` either ``raw`` cut at any byte, or ``raw`` with 1..``max_flips`` bits
    flipped anywhere: the two damages every reader of a text or binary table must survive."""
    from hypothesis import strategies as st

    if data.draw(st.booleans()):
        return raw[: data.draw(st.integers(0, len(raw) - 1))]
    bits = data.draw(st.lists(st.integers(0, len(raw) * 8 - 1), min_size=1, max_size=max_flips))
    for bit in bits:
        raw = flip(raw, bit)
    return raw


HOSTILE_TEXT = ["", " ", "\x00", "a" * 5000, "{family}", "{", "1e999", "nan", "-", "..", "/", "~", "ÿ\u2028"]
"""Strings that have tripped parsers: empty, a NUL, past a file name's length, format fields, number-like."""


def hostile_values(max_leaves: int = 6) -> Any:
    """Any value a YAML or JSON file can hold, weighted to the ones readers forget: None, booleans where
    numbers go, 0, negatives, integers past 64 bits and past a float's range, NaN and infinities, hostile
    strings, and lists and mappings of these where scalars go (and the reverse)."""
    from hypothesis import strategies as st

    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63), 10**30, 10**400]),
        st.floats(),
        st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, 5e-324, -0.0]),
        st.text(max_size=12),
        st.sampled_from(HOSTILE_TEXT),
    )
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
        max_leaves=max_leaves,
    )


def dotted_keys(data: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key path of a nested mapping (sections and their leaves), for mutating one at a time."""
    out = []
    for key, value in data.items():
        out.append((*prefix, key))
        if isinstance(value, dict):
            out.extend(dotted_keys(value, (*prefix, key)))
    return out


def set_path(data: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    """``data[path[0]][path[1]]... = value``; integer parts index lists."""
    node = data
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


def _bomb(levels: int) -> str:
    text = "&l0 [x, x, x, x, x, x, x, x, x]"
    for level in range(1, levels):
        text = f"&l{level} [{text}" + f", *l{level - 1}" * 8 + "]"
    return text


YAML_BOMB = _bomb(8)
"""A "billion laughs" YAML value (one flow list, anchors defined inside it): 9**8 leaves if anything
expanded its aliases, as ``repr`` of it would. Put it where any value goes: ``seed: {YAML_BOMB}``."""


YAML_DEEP = "[" * 600
"""Flow lists nested past Python's recursion limit in PyYAML's composer (a few frames per level). Deeper
costs PyYAML's scanner quadratic time before it gets there (100,000 levels: about 5 s), not another error."""
