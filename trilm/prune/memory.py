"""Peak tensor memory of a piece of work, from the allocator's records (CPU and CUDA alike).

On CUDA the caching allocator keeps exact counters. On CPU there are none, but with ``profile_memory=True``
the profiler reports every allocation and free of PyTorch's CPU allocator; replaying them in time order
gives the bytes live at every instant, hence the peak. Both are measured above the level at entry, so the
model's weights (already allocated) are added separately (:func:`tensor_bytes`). Max RSS would count the
Python heap, libraries and freed-but-kept pages, and could not tell a forward pass from a PG step.
(The training helper measures training memory the same way; the two can share one helper once merged.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterable, Iterator

import torch


@dataclasses.dataclass
class Peak:
    bytes: int = 0
    method: str = ""


@contextlib.contextmanager
def measure_peak(device: torch.device | str = "cpu") -> Iterator[Peak]:
    """``with measure_peak(device) as p: work()`` → ``p.bytes``: peak tensor bytes above the entry level."""
    device = torch.device(device)
    result = Peak()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        yield result
        torch.cuda.synchronize(device)
        result.bytes = torch.cuda.max_memory_allocated(device) - start
        result.method = "torch.cuda.max_memory_allocated"
        return
    from torch.profiler import ProfilerActivity, profile

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
    result.bytes = peak
    result.method = "CPU allocator records (torch.profiler, profile_memory=True)"


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


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def model_bytes(model: torch.nn.Module) -> int:
    """Parameters and persistent or not buffers of a model (what inference holds before any activation)."""
    return tensor_bytes([*model.parameters(), *model.buffers()])
