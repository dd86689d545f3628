"""The errors of the model store: each names the directory or file, and the tensor or field, at fault.

They derive from :class:`~trilm.config.ConfigError`, so every ``trilm`` command prints them as one line and
exits with status 2: a damaged or wrong model directory is the user's input, not a bug.
"""

from __future__ import annotations

from trilm.config import ConfigError


class StoreError(ConfigError):
    """A model directory cannot be used as asked (wrong kind, missing file, foreign tokenizer, …)."""


class IntegrityError(StoreError):
    """A file differs from what was written (size, CRC-32), cannot be read, or holds non-finite weights."""
