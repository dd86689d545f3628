"""Launch configs of the affine kernels: candidates, defaults, and tuning results persisted as JSON.

A config is resolved once per (layer shape, format, M bucket, dtype) — from the tuning cache when it has an
entry, else from the default below — and then frozen into a launch plan, so a forward call never runs the
autotuner. On a GPU the first call of a new key times the candidates (``triton.testing.do_bench``) and
writes the winner to the cache file (``$TRILM_KERNEL_CACHE``, default ``~/.cache/trilm/kernel_tuning.json``);
``TRILM_KERNEL_TUNE=0`` skips timing and uses the defaults. Nothing is timed while a CUDA graph is being
captured (the default is used and not stored).

The cuBLAS crossover: from ``CUBLAS_MIN_M`` rows on, the weight is dequantized to the activation dtype by one
kernel and the product handed to cuBLAS, which wins once the product is compute-bound and the dequantized
copy (2·N·K bytes) is small next to it. 512 is a guess from the roofline (the GEMM decodes each weight tile
once per BLOCK_M rows). Measure it with ``python -m benchmarks.kernels --crossover`` on the GPU, which times
both paths over M and stores the measured crossover per device and format in the same cache file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trilm.atomic import write_text

CUBLAS_MIN_M = 512
"""Batches of at least this many rows take dequantize + cuBLAS (overridden by a measured crossover)."""
GEMV_MAX_M = 8
"""The most rows the affine GEMV takes (all rows in one program, weights read once), when asked for."""
TC_MIN_M = 2
"""Batches of at least this many rows take the tensor-core GEMM. A roofline guess, not yet timed: the GEMV
decodes each weight once on CUDA cores in fp32 and then spends one FMA per weight *per row* (plus the sum of
x), so at 2-bit weights streamed at 4.25 TB/s two rows already ask ≈ 70 T instructions per second of an
H200's ≈ 34 T of fp32 issue; the GEMM decodes each weight once per 16 rows and leaves the products to the
tensor cores. ``python -m benchmarks.kernels`` times both paths at batch 1–16 on a GPU."""

GEMV_PROGRAMS_PER_SM = 4
"""Programs per SM a GEMV grid aims for (split-K fills what N leaves): with 4 warps each, four warps per
scheduler, so one warp waiting on a load or an FMA chain leaves others to issue (an H200 profile of 8 × 16
programs of 4 warps, one stage: half a wave, one warp per scheduler, no eligible warp in 67 % of cycles)."""
GEMM_PROGRAMS_PER_SM = 4
"""The same for the GEMM, whose programs are larger (a tile of every batch row)."""
GEMV_MAX_SPLIT = 96
"""The deepest K split: every split adds an fp32 partial of M × N to the workspace (L2-resident) traffic."""

GEMV_CANDIDATES: dict[int, list[dict[str, Any]]] = {
    1: [
        {"BLOCK_R": 4, "BLOCK_N": 512, "num_warps": 4, "num_stages": 3},
        {"BLOCK_R": 4, "BLOCK_N": 256, "num_warps": 4, "num_stages": 3},
        {"BLOCK_R": 8, "BLOCK_N": 128, "num_warps": 4, "num_stages": 3},
        {"BLOCK_R": 8, "BLOCK_N": 256, "num_warps": 4, "num_stages": 2},
        {"BLOCK_R": 4, "BLOCK_N": 1024, "num_warps": 8, "num_stages": 3},
        {"BLOCK_R": 2, "BLOCK_N": 512, "num_warps": 4, "num_stages": 4},
        {"BLOCK_R": 8, "BLOCK_N": 512, "num_warps": 4, "num_stages": 1, "PROGRAMS_PER_SM": 2},
        {"BLOCK_R": 4, "BLOCK_N": 512, "num_warps": 4, "num_stages": 3, "PAIRS": True},
        {"BLOCK_R": 4, "BLOCK_N": 1024, "num_warps": 4, "num_stages": 2, "PAIRS": True},
    ],
    2: [
        {"BLOCK_R": 4, "BLOCK_N": 512, "num_warps": 4, "num_stages": 3},
        {"BLOCK_R": 2, "BLOCK_N": 512, "num_warps": 4, "num_stages": 3},
        {"BLOCK_R": 4, "BLOCK_N": 256, "num_warps": 4, "num_stages": 2},
    ],
    4: [
        {"BLOCK_R": 2, "BLOCK_N": 512, "num_warps": 4, "num_stages": 3},
        {"BLOCK_R": 4, "BLOCK_N": 256, "num_warps": 4, "num_stages": 3},
        {"BLOCK_R": 1, "BLOCK_N": 1024, "num_warps": 4, "num_stages": 2},
    ],
    8: [
        {"BLOCK_R": 2, "BLOCK_N": 256, "num_warps": 4, "num_stages": 3},
        {"BLOCK_R": 1, "BLOCK_N": 512, "num_warps": 4, "num_stages": 3},
        {"BLOCK_R": 1, "BLOCK_N": 256, "num_warps": 2, "num_stages": 2},
    ],
}
"""Per BM (batch rows padded to a power of two), for 16 codes per unit (2-bit); formats with 32 codes per
unit (binary, 3-bit) take half the rows (:func:`trilm.kernels.affine.plan.candidates`). The first of each
list is the default where nothing was tuned: a pipelined tile (≥ 2 stages, so the next tile's words load
while this one decodes) small enough for 4+ programs per SM. A thread holds BLOCK_R rows × BLOCK_N /
threads columns of words and BM times as many fp32 accumulators, so larger batches take fewer rows.
Registers, shared memory, occupancy and bytes in flight of each default at every Spectra and Llama layer
shape: ``python -m benchmarks.kernels.tools.launch_table`` (the table in docs/kernels.md).

``"PAIRS": True`` decodes two codes per instruction in the activations' fp16/bf16 (ternary, binary, int2,
int4; :func:`trilm.kernels.affine.jit._pair_tile`): 20–42 % fewer SASS instructions per weight at sm_90
under Triton 3.9, 25–38 % under 3.6 (``python -m benchmarks.kernels --instructions``), but not yet timed on
a GPU, so these plans are candidates the tuner times, not the default."""

GEMM_CANDIDATES: dict[int, list[dict[str, Any]]] = {
    16: [
        {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4},
        {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3},
        {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2},
    ],
    32: [
        {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3},
        {"BLOCK_M": 32, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2},
    ],
    64: [
        {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3},
        {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 2},
    ],
    128: [
        {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 2},
        {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3},
    ],
    256: [
        {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 2},
        {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 8, "num_stages": 3},
    ],
}
"""Per M bucket; every candidate pipelines its loads (num_stages ≥ 2)."""

AFFINE_INTERP_GEMV = {"BLOCK_R": 32, "BLOCK_N": 128, "num_warps": 4, "num_stages": 1}
AFFINE_INTERP_GEMM = {"BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 1}
"""Interpreter configs: few, large programs (its cost is per program and per op)."""


def gemv_bucket(m: int) -> int:
    """BM, the batch rows one GEMV program holds: the next power of two ≥ m (≤ GEMV_MAX_M)."""
    return 1 << max(0, (m - 1).bit_length())


def gemm_bucket(m: int) -> int:
    """16, 32, 64, 128 or 256: the GEMM config class of a batch of ``m`` rows."""
    for b in (16, 32, 64, 128):
        if m <= b:
            return b
    return 256


def default_cache_path() -> Path:
    env = os.environ.get("TRILM_KERNEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "trilm" / "kernel_tuning.json"


def tuning_enabled() -> bool:
    return os.environ.get("TRILM_KERNEL_TUNE", "1").strip().lower() not in ("0", "false", "no", "off")


class TuningCache:
    """Measured launch configs and crossovers by key, kept in one JSON file.

    The file holds ``{"version": 1, "entries": {key: {"config": {...}, "us": float}}}``. Writes go to a
    temporary name and are renamed, so a crash never leaves half a file; an unreadable file is refused with
    its path, not silently replaced."""

    VERSION = 1

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_cache_path()
        self.entries: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            self.entries = self._read()

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(
                f"{self.path}: kernel tuning cache is not valid JSON ({exc}); delete it"
            ) from None
        if not isinstance(data, dict) or data.get("version") != self.VERSION:
            raise ValueError(f"{self.path}: expected a kernel tuning cache of version {self.VERSION}")
        entries = data.get("entries")
        if not isinstance(entries, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("config"), dict) for v in entries.values()
        ):
            raise ValueError(f"{self.path}: field 'entries' must map keys to {{'config': {{...}}}}")
        return entries

    def get(self, key: str) -> dict[str, Any] | None:
        entry = self.entries.get(key)
        return None if entry is None else dict(entry["config"])

    def put(self, key: str, config: dict[str, Any], us: float | None = None) -> None:
        self.entries[key] = {"config": dict(config), "us": us}

    def save(self) -> None:
        write_text(
            self.path,
            json.dumps({"version": self.VERSION, "entries": self.entries}, indent=1, sort_keys=True),
        )


_CACHE: TuningCache | None = None


def shared_cache() -> TuningCache:
    """The process-wide cache over :func:`default_cache_path` (re-read when that path changes)."""
    global _CACHE
    if _CACHE is None or _CACHE.path != default_cache_path():
        _CACHE = TuningCache()
    return _CACHE
