"""What the engine needs before it runs: threads, device and dtype defaults, the tokenizer, the model.

Each default is decided in one function here, so ``Engine.load``, the CLI and the benchmarks agree:

* **threads** — torch's own default is the machine's physical cores, which oversubscribes a process limited
  by CPU affinity or a cgroup quota (a container); :func:`configure_threads` uses the CPUs this process may
  actually run on. The engine steps in one thread and the HTTP server only awaits sockets, so torch's
  intra-op pool gets every CPU; inductor bakes the count into compiled code, so it is set before compiling.
* **device / dtype** — CUDA when available; bf16 on CUDA, fp32 on CPU — except a packed model on CPU
  (``packed=True``, CPU backend), which runs in bf16 because torch's int4 CPU kernel is vectorized for bf16
  only (:mod:`trilm.kernels.cpu`); in fp32 its layers are dequantized once and run as float layers.
* **tokenizer** — the model's own, chosen by the store's one policy (:mod:`trilm.store.tokenizer`), unless
  one is given.
* **model** — :func:`trilm.infer.load_inference_model`; ``packed=True`` on a model with nothing to pack is
  refused by name, and packed layers are converted for the CPU backend at load, not on the first request.
  Q/K/V and gate/up are stacked into one matrix each (:func:`trilm.infer.fuse_projections`, ``fuse=False``
  keeps them apart): the same dot products in two launches instead of five per block, since a decode step
  at one token is launch-bound on a GPU; sub-blocks whose projections cannot be stacked stay as they are.
  On CPU in bf16 the float linears (block linears a model keeps in float, and the head) are reordered once
  for oneDNN (:mod:`trilm.kernels.cpu_dense`, ``prepack=False`` keeps ``nn.Linear``): the same product,
  1.7–2.3× as fast per layer at one row (1.75× the 190m FloatLM's decode).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from trilm.config import ConfigError
from trilm.data.tokenizer import Tokenizer
from trilm.infer import fuse_projections, load_inference_model
from trilm.infer.model import InferenceModel
from trilm.store.open import ModelDir

log = logging.getLogger(__name__)


def available_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup v2 CPU quota when one is set."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        count = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            count = min(count, max(1, int(int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, count)


def configure_threads(threads: int | None) -> int:
    """Set torch's intra-op threads to ``threads`` (default: :func:`available_cpus`); returns the count."""
    if threads is not None and threads < 1:
        raise ConfigError(f"threads: must be >= 1, got {threads}")
    count = threads or available_cpus()
    torch.set_num_threads(count)
    return count


def resolve_device(device: str | torch.device | None) -> torch.device:
    try:
        resolved = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as exc:
        raise ConfigError(f"device: {exc}") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device: {resolved} requested but CUDA is not available")
    return resolved


def resolve_dtype(
    device: torch.device, dtype: torch.dtype | None, packed: bool = False, backend: str = "auto"
) -> torch.dtype:
    """``dtype``, or the default for ``device`` (module docstring; bf16 for packed layers on CPU only where
    they run on the CPU backend, not the reference or the interpreter)."""
    if dtype is not None:
        return dtype
    if device.type == "cuda" or (packed and backend in ("auto", "cpu") and not _interpreting()):
        return torch.bfloat16
    return torch.float32


def _interpreting() -> bool:
    # deferred for start-up time: loads triton only when called
    from trilm.kernels import interpreting

    return interpreting()


def resolve_tokenizer(opened: ModelDir, tokenizer: Tokenizer | str | Path | None) -> Tokenizer | None:
    """A loaded tokenizer given by the caller, else the one the store chose when opening (a path given
    to :func:`trilm.store.open_model` is checked there)."""
    return tokenizer if isinstance(tokenizer, Tokenizer) else opened.tokenizer.tokenizer


def load_model(
    path: str | Path | ModelDir,
    *,
    device: torch.device,
    dtype: torch.dtype,
    packed: bool = False,
    backend: str = "auto",
    prepack: bool = True,
    fuse: bool = True,
) -> tuple[InferenceModel, list[str]]:
    """The inference model on ``device`` in ``dtype`` and notes for the user (what ``packed``, ``fuse``
    and ``prepack`` did)."""
    # deferred for start-up time: loads triton only when called
    from trilm.kernels import QuantLinear

    model = load_inference_model(path, device=device, dtype=dtype, packed=packed, backend=backend)
    path = path.given if isinstance(path, ModelDir) else path
    notes: list[str] = []
    if fuse:  # before the CPU conversions below, which then convert the stacked layers once
        fused = fuse_projections(model)
        if fused:
            notes.append(f"{fused} Q/K/V and gate/up groups stacked into one matrix each (fuse=False: apart)")
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    if packed:
        family = model.cfg.family
        if not layers:
            raise ConfigError(
                f"packed: {path} is a {family} with float block weights only: nothing to pack (packing "
                "serves TriLM/BiLM latent weights as ternary/binary; quantize a FloatLM with trilm quantize)"
            )
        if family == "floatlm":
            notes.append(f"packed: {path} is a QuantLM, stored packed already; nothing more to pack")
    if layers and device.type == "cpu":
        for layer in layers:
            if layer.backend in ("auto", "cpu"):
                layer.prepare_cpu(dtype)
        kernel = "torch's int4 CPU kernel" if dtype == torch.bfloat16 else "dequantized once (float layers)"
        notes.append(f"{len(layers)} packed layers on CPU in {str(dtype).removeprefix('torch.')}: {kernel}")
    if prepack and device.type == "cpu" and dtype == torch.bfloat16:
        # deferred for start-up time: loads triton only when called
        from trilm.kernels.cpu_dense import prepack_float_linears

        names = [n for n, m in model.named_modules() if type(m) is torch.nn.Linear]  # stacked ones too
        count = prepack_float_linears(model, names)
        if count:
            notes.append(f"{count} float linears on CPU in bf16: reordered once for oneDNN")
    return model, notes
