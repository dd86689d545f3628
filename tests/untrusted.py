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
