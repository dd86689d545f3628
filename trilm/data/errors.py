"""The one exception type of the data path.

It derives from :class:`~trilm.config.ConfigError` so that ``trilm data ...`` prints it as a one-line error
(exit status 2) instead of a traceback: bad input data is a user problem, not a bug.
"""

from __future__ import annotations

from trilm.config import ConfigError


class DataError(ConfigError):
    """Bad or inconsistent data; the message names the file (and line) or the mismatching field."""
