"""Peak memory of a piece of work, measured from the allocator's own records on CPU and GPU alike.

Why not max RSS: it counts the Python heap, imported libraries and pages the allocator has freed but not
returned, so two models of nearly equal footprint are indistinguishable. On CUDA the caching allocator keeps
exact counters (``max_memory_allocated``). On CPU there are none, but every allocation and free of PyTorch's
CPU allocator is reported to the profiler when ``profile_memory=True``; replaying those records in time order
gives the bytes live at every instant, hence the peak. Both measure *tensor* memory above the level at entry
(weights that already exist are the caller's to add: :func:`tensor_bytes`, :func:`model_bytes`).

Training (the memory bound of TriLM vs FloatLM, the engine benchmark) and pruning (a PG step against a plain
forward) both measure through this one module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterable, Iterator

import torch
from torch.profiler import ProfilerActivity, profile


@dataclasses.dataclass
class PeakMemory:
    """Filled in when the ``measure_peak`` block exits."""

    peak_bytes: int = 0
    """Highest bytes allocated above the level at entry."""
    end_bytes: int = 0
    """Bytes still allocated at exit, above the level at entry (e.g. gradients created inside)."""
    method: str = ""


@contextlib.contextmanager
def measure_peak(device: torch.device | str = "cpu") -> Iterator[PeakMemory]:
    """``with measure_peak(device) as m: work()`` → ``m.peak_bytes``: the allocator-level peak of ``work``."""
    device = torch.device(device)
    result = PeakMemory()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        yield result
        torch.cuda.synchronize(device)
        result.peak_bytes = torch.cuda.max_memory_allocated(device) - start
        result.end_bytes = torch.cuda.memory_allocated(device) - start
        result.method = "torch.cuda.max_memory_allocated"
        return

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield result
    records = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    )
    live = peak = 0
    for _, nbytes in records:
        live += nbytes
        peak = max(peak, live)
    result.peak_bytes, result.end_bytes = peak, live
    result.method = "CPU allocator records (torch.profiler, profile_memory=True)"


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views and repeats counted once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def model_bytes(model: torch.nn.Module) -> int:
    """Parameters and buffers of a model (what inference holds before any activation)."""
    return tensor_bytes([*model.parameters(), *model.buffers()])


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (the profiler's C++ start/stop lines and allocator notes) for the block."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        sys.stderr.flush()
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
