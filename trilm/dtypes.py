"""Float dtypes by name: the one map from what configs and command lines write to torch dtypes and back.

Options take the long names (``float32``, ``bfloat16``, ``float16``), which are torch's own; the short ones
(``fp32``, ``bf16``, ``fp16``) that kernel tools use are accepted as aliases. A name that is not here is
refused naming the option it came from and the choices. Torch is imported only when a name is resolved, so
command-line parsers can offer the choices without it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from trilm.config import ConfigError

if TYPE_CHECKING:
    import torch

DTYPE_NAMES: tuple[str, ...] = ("float32", "bfloat16", "float16")
ALIASES: dict[str, str] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def parse_dtype(name: str, what: str = "dtype", choices: Iterable[str] = DTYPE_NAMES) -> torch.dtype:
    """The torch dtype ``name`` (or its alias) stands for, if it is one of ``choices``; else a ConfigError
    naming ``what`` (the option or key) and the choices."""
    # deferred for start-up time: loads torch only when called
    import torch

    allowed = tuple(choices)
    canonical = ALIASES.get(name, name)
    if canonical not in DTYPE_NAMES or not ({name, canonical} & set(allowed)):
        raise ConfigError(f"{what} {name!r}: choose one of {', '.join(allowed)}")
    return getattr(torch, canonical)


def dtype_name(dtype: torch.dtype) -> str:
    """``float16`` for ``torch.float16`` (the name options and metadata use)."""
    return str(dtype).removeprefix("torch.")
