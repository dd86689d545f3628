"""The error every scaling tool raises when a fit cannot be made or trusted, or its input is malformed."""

from __future__ import annotations

from trilm.config import ConfigError


class FitError(ConfigError):
    """A scaling-law fit cannot be made or trusted, or its input is malformed; the message says which fit,
    file or point, and why."""


__all__ = ["FitError"]
