"""Throughput, MFU and logging sinks (JSONL + TensorBoard).

MFU = achieved model FLOP/s ÷ (peak FLOP/s per device × devices). Model FLOPs come from the one FLOPs
function (:func:`trilm.model.flops.flops_per_token`); the quantizer's elementwise work is not counted, so a
TriLM and a FloatLM of the same shape have the same FLOPs per token and their MFU compares wall time.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any

import torch

# Dense peak FLOP/s per device (bf16/fp16 tensor cores, no sparsity), from the vendors' datasheets.
PEAK_FLOPS: dict[str, float] = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "A10G": 125e12,
    "L40S": 362e12,
    "L4": 121e12,
    "V100": 125e12,
    "RTX 4090": 165e12,
}


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return "cpu"


def peak_flops(name: str | None = None) -> float | None:
    """Peak FLOP/s of a device by name (None when unknown, e.g. a CPU: MFU is then not reported)."""
    name = name or device_name()
    for key in sorted(PEAK_FLOPS, key=len, reverse=True):
        if key.lower() in name.lower():
            return PEAK_FLOPS[key]
    return None


def memory_gb() -> float:
    """Peak memory of this process: CUDA allocator peak on GPU, max RSS on CPU."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


class Throughput:
    """Tokens/s, TFLOP/s, MFU and data-wait share over the steps since the last ``report``."""

    def __init__(self, flops_per_token: float, devices: int):
        self.flops_per_token, self.devices = flops_per_token, devices
        self.peak = peak_flops()
        self.reset()

    def reset(self) -> None:
        self.tokens, self.seconds, self.data_seconds = 0, 0.0, 0.0

    def add(self, tokens: int, seconds: float, data_seconds: float) -> None:
        self.tokens += tokens
        self.seconds += seconds
        self.data_seconds += data_seconds

    def report(self) -> dict[str, float | None]:
        secs = max(self.seconds, 1e-9)
        tok_s = self.tokens / secs
        flops = tok_s * self.flops_per_token
        out = {
            "tokens_per_s": tok_s,
            "tflops": flops / 1e12,
            "mfu": flops / (self.peak * self.devices) if self.peak else None,
            "data_wait": self.data_seconds / secs,
        }
        self.reset()
        return out


class MetricsLogger:
    """Rank-0 sink: one JSON object per line in ``metrics.jsonl`` (and TensorBoard scalars if enabled)."""

    def __init__(self, log_dir: Path, enabled: bool, tensorboard: bool):
        self.enabled = enabled
        self.tb = None
        if not enabled:
            return
        log_dir.mkdir(parents=True, exist_ok=True)
        self.metrics = open(log_dir / "metrics.jsonl", "a")  # noqa: SIM115 - closed by close()
        self.events = open(log_dir / "events.jsonl", "a")  # noqa: SIM115 - closed by close()
        if tensorboard:
            # deferred for start-up time: loads tensorboard only when it is asked for
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(log_dir / "tensorboard"))

    def log(self, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"step": step, "time": time.time(), **values}
        self.metrics.write(json.dumps(record) + "\n")
        self.metrics.flush()
        if self.tb is not None:
            for key, value in values.items():
                if isinstance(value, int | float):
                    self.tb.add_scalar(key, value, step)

    def event(self, step: int, name: str, detail: str = "", **extra: Any) -> None:
        if not self.enabled:
            return
        record = {"step": step, "event": name, "detail": detail, "time": time.time(), **extra}
        self.events.write(json.dumps(record) + "\n")
        self.events.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        self.metrics.close()
        self.events.close()
        if self.tb is not None:
            self.tb.close()
