"""What every Triton launch path shares: interpreter detection, kernel-module (re)import, device facts.

``@triton.jit`` decides between interpreter and compiler when a kernel module is imported, so
:func:`kernel_module` re-imports one (with the shared helpers of :mod:`trilm.kernels.jit_common` first)
whenever the ``TRITON_INTERPRET`` setting has changed since, and tells the launch code that caches kernels
built over a module (:func:`on_reload`).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable
from types import ModuleType

import torch

JIT_COMMON = "trilm.kernels.jit_common"
_reload_hooks: list[Callable[[], None]] = []


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def on_reload(hook: Callable[[], None]) -> Callable[[], None]:
    """Call ``hook`` whenever :func:`kernel_module` re-imports a kernel module (e.g. to drop caches)."""
    _reload_hooks.append(hook)
    return hook


def kernel_module(name: str) -> ModuleType:
    """A kernel module, (re)imported so its ``@triton.jit`` matches the interpreter setting."""
    reloaded = False
    for mod_name in (JIT_COMMON, name):
        mod = sys.modules.get(mod_name)
        if mod is None:
            importlib.import_module(mod_name)
        elif interpreting() != mod.INTERPRET:
            importlib.reload(mod)
            reloaded = True
    if reloaded:
        for hook in _reload_hooks:
            hook()
    return sys.modules[name]


@functools.lru_cache(maxsize=8)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 8 elsewhere (the interpreter's notional grid)."""
    return _sm_count(device.index or 0) if device.type == "cuda" else 8


def current_stream(device: torch.device) -> int:
    """The raw CUDA stream launches go to (0 off CUDA)."""
    if device.type != "cuda":
        return 0
    return torch._C._cuda_getCurrentRawStream(
        device.index if device.index is not None else torch.cuda.current_device()
    )
