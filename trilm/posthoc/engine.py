"""The block-wise driver: calibrate and compress one transformer block at a time on the lean inference model.

Why block by block: only one block, its calibration activations and its statistics have to sit on the
device, so a model far larger than the device's memory can be compressed, and every block is calibrated on
the inputs the *compressed* model will really feed it.

1. The calibration windows are embedded once (block 0's inputs, kept on the device as one [N, L, d] tensor).
2. For each block: move it to the device; if the method needs them, compute the float block's outputs
   (targets); let the method collect its statistics through forward hooks on the block's linears and
   replace their weights by the compressed ones; recompute the block's outputs **with the compressed
   weights** — they are the next block's inputs; move the block back.
3. Peak memory is measured (CUDA: allocator peak; CPU: the driver's working set from the tensors it holds,
   next to the process's peak RSS) and reported with a progress bar per block.

Nothing here needs a process group: the model is :class:`trilm.infer.InferenceModel`. The pieces other
methods reuse — :func:`run_block`, :func:`collect_inputs`, :func:`site_modules` and the
:class:`BlockMethod` interface — are public (pruning hooks the same way). Which linears a block has and
which input site each reads is the architecture spec's (:mod:`trilm.model.spec`).
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import resource
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from trilm.config import Config, ConfigError, require
from trilm.formats import PackedWeight
from trilm.model.spec import BY_NAME, LINEAR_NAMES


@dataclasses.dataclass
class EngineConfig(Config):
    device: str = "cpu"
    batch_size: int = 8
    """Calibration sequences per block forward (bounds the activation memory of attention)."""
    progress: bool = True

    def validate(self) -> None:
        require(self.batch_size > 0, f"batch_size: must be > 0, got {self.batch_size}")
        try:
            device = torch.device(self.device)
        except RuntimeError as exc:
            raise ConfigError(f"device: {exc}") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device: {self.device} requested but no CUDA device is available")


@dataclasses.dataclass
class LayerRecord:
    """What a method produced for one linear (canonical name without ``.weight``)."""

    packed: PackedWeight
    proxy_loss: float | None = None
    seconds: float = 0.0
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class BlockContext:
    """Everything a method sees of one block."""

    index: int
    block: nn.Module
    """On the device, float weights; the method replaces its linears' weights in place."""
    inputs: torch.Tensor | None
    """[N, L, d] the block's inputs in the compressed model (outputs of the compressed blocks before);
    None for a data-free method."""
    targets: torch.Tensor | None
    """[N, L, d] the float block's outputs on the float model's inputs (methods with needs_targets)."""
    cos: torch.Tensor | None
    sin: torch.Tensor | None
    batch_size: int
    report: Callable[[str], None]
    """Shows a short status (layer and proxy loss, epoch and loss) next to the progress bar."""

    @property
    def prefix(self) -> str:
        return f"layers.{self.index}."


class BlockMethod(abc.ABC):
    """A compression method driven block by block (GPTQ-family layer methods, OmniQuant, ...)."""

    name: str = ""
    needs_targets: bool = False
    """The driver keeps a float stream and passes the float block's outputs as ``ctx.targets``."""

    @property
    def data_free(self) -> bool:
        """Compresses a block from its weights alone: the driver then embeds and recomputes no calibration
        stream (``ctx.inputs`` is None)."""
        return False

    @abc.abstractmethod
    def quantize_block(self, ctx: BlockContext) -> dict[str, LayerRecord]:
        """Compress ``ctx.block`` in place (its linears end up holding the dequantized weights) and return
        the packed layers by canonical name without ``.weight``."""

    def statistics_bytes(self) -> int:
        """Peak bytes of the method's own statistics in the last block (Hessians, parameters)."""
        return 0

    def recompute(self, ctx: BlockContext) -> None:
        """Overwrite ``ctx.inputs`` with the compressed block's outputs (the next block's inputs).

        The default runs the block module; a method whose compressed model computes differently from
        the module (activation quantization) overrides it."""
        run_block(ctx.block, ctx.inputs, ctx.cos, ctx.sin, ctx.batch_size, out=ctx.inputs)

    def describe(self) -> dict[str, Any]:
        """JSON-able settings recorded in the QuantLM metadata."""
        return {}

    def prepare(self, model: nn.Module, inputs: torch.Tensor, cos, sin, cfg: EngineConfig) -> None:  # noqa: B027
        """Called once before the first block with block 0's inputs (not to be modified): methods that need
        whole-model statistics first (STBLLM's per-layer N) collect them here."""

    def finish(
        self, model: nn.Module, layers: dict[str, LayerRecord], cfg: EngineConfig
    ) -> dict[str, LayerRecord]:
        """Called once after the last block (model on the CPU, holding the compressed weights): methods that
        train the whole compressed model (PB-LLM's QAT) do it here and return the final layers."""
        return layers


@dataclasses.dataclass
class EngineReport:
    layers: dict[str, LayerRecord]
    seconds: float
    memory: dict[str, Any]
    block_seconds: list[float]

    def memory_line(self) -> str:
        m = self.memory
        mib = 2.0**20
        parts = [
            f"working set ≤ {m['working_set_bytes'] / mib:.1f} MiB (largest block "
            f"{m['block_bytes'] / mib:.1f} MiB + activations {m['activation_bytes'] / mib:.1f} MiB + "
            f"statistics {m['statistics_bytes'] / mib:.1f} MiB; whole model {m['model_bytes'] / mib:.1f} MiB)"
        ]
        if m.get("device_peak_bytes") is not None:
            parts.append(f"device peak {m['device_peak_bytes'] / mib:.1f} MiB")
        parts.append(f"process peak RSS {m['host_peak_rss_bytes'] / mib:.0f} MiB")
        return "; ".join(parts)


def tensor_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def module_bytes(module: nn.Module) -> int:
    return tensor_bytes(module.parameters()) + tensor_bytes(module.buffers())


def site_modules(
    linears: Mapping[str, nn.Module], names: Iterable[str] | None = None
) -> dict[str, nn.Module]:
    """One module per input site of the linears ``names`` (default: all of ``linears``), the first in
    forward order that reads it: a hook on its input sees the site's tensor (q, k and v share one)."""
    wanted = set(linears if names is None else names)
    sites: dict[str, nn.Module] = {}
    for name in LINEAR_NAMES:
        if name in wanted and name in linears:
            sites.setdefault(BY_NAME[name].site, linears[name])
    return sites


@torch.no_grad()
def run_block(
    block: nn.Module,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    batch_size: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """block(x) over the calibration set in batches of ``batch_size`` sequences (``out`` may alias ``x``)."""
    out = torch.empty_like(x) if out is None else out
    for start in range(0, x.shape[0], batch_size):
        stop = start + batch_size
        out[start:stop] = block(x[start:stop], cos, sin)
    return out


class _StopForward(Exception):
    """Raised by a statistics hook once every input of interest has been seen (skips the rest)."""


@torch.no_grad()
def collect_inputs(
    block: nn.Module,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    batch_size: int,
    modules: Mapping[str, nn.Module],
    callback: Callable[[str, torch.Tensor], None],
    *,
    stop_early: bool = True,
) -> None:
    """Run the block over the calibration set and call ``callback(key, input)`` with every batch's input
    of each module in ``modules``. With ``stop_early`` the forward stops after the last of them (given in
    forward order), so statistics of early linears cost only the start of the block."""
    keys = list(modules)
    handles = []
    for key in keys:
        last = stop_early and key == keys[-1]

        def hook(_module, args, _key=key, _last=last):
            callback(_key, args[0].detach())
            if _last:
                raise _StopForward

        handles.append(modules[key].register_forward_pre_hook(hook))
    try:
        for start in range(0, x.shape[0], batch_size):
            with contextlib.suppress(_StopForward):
                block(x[start : start + batch_size], cos, sin)
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def capture_inputs(model: nn.Module, windows: torch.Tensor, device: torch.device, dtype: torch.dtype):
    """Block 0's inputs for every calibration window: the token embeddings, as one [N, L, d] tensor."""
    embed = model.embed
    original = embed.weight.device
    embed.to(device)
    try:
        return embed(windows.to(device)).to(dtype)
    finally:
        embed.to(original)


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def quantize_blockwise(
    model: nn.Module, windows: torch.Tensor | None, method: BlockMethod, cfg: EngineConfig | None = None
) -> EngineReport:
    """Compress every block of ``model`` (an InferenceModel, float, on the CPU) in place with ``method``.

    Returns the packed layers and timing/memory figures; the model's linears hold the dequantized
    weights afterwards, so it computes what the packed QuantLM computes. ``windows`` None runs a
    data-free method (one that reads no inputs, ``BlockMethod.data_free``): no calibration stream is
    embedded or recomputed, each block only visits the device to be compressed.
    """
    cfg = cfg or EngineConfig()
    device = torch.device(cfg.device)
    dtype = model.embed.weight.dtype
    start = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if windows is None:
        if not method.data_free:
            raise ConfigError(f"{method.name}: needs calibration windows (it reads the blocks' inputs)")
        x = fp = cos = sin = None
    else:
        if windows.dim() != 2:
            raise ConfigError(f"calibration windows must be [samples, seq_len], got {tuple(windows.shape)}")
        seq = windows.shape[1]
        if seq > model.cfg.context:
            raise ConfigError(f"calibration seq_len {seq} exceeds the model context {model.cfg.context}")
        x = capture_inputs(model, windows, device, dtype)
        fp = x.clone() if method.needs_targets else None
        cos, sin = model.rope(seq, dtype)
        cos, sin = cos.to(device), sin.to(device)
        method.prepare(model, x, cos, sin, cfg)
    layers: dict[str, LayerRecord] = {}
    block_seconds: list[float] = []
    worst = {"block": 0, "activations": 0, "statistics": 0, "total": 0}

    bar = tqdm(total=len(model.layers), desc=method.name, unit="block", disable=not cfg.progress)
    try:
        for index, block in enumerate(model.layers):
            t0 = time.perf_counter()
            block.to(device)
            targets = None
            if fp is not None:
                targets = run_block(block, fp, cos, sin, cfg.batch_size, out=fp)

            def report(status: str, _i: int = index) -> None:
                bar.set_postfix_str(f"block {_i} {status}", refresh=True)

            ctx = BlockContext(index, block, x, targets, cos, sin, cfg.batch_size, report)
            records = method.quantize_block(ctx)
            layers.update(records)
            if x is not None:
                method.recompute(ctx)
                if not bool(torch.isfinite(x).all()):
                    raise ConfigError(f"block {index}: the quantized block produced inf/NaN activations")
            sizes = {
                "block": module_bytes(block),
                "activations": tensor_bytes((x, fp)),
                "statistics": method.statistics_bytes(),
            }
            sizes["total"] = sum(sizes.values())
            worst = {k: max(worst[k], v) for k, v in sizes.items()}
            block.to("cpu")
            block_seconds.append(time.perf_counter() - t0)
            bar.update(1)
    finally:
        bar.close()
    layers = method.finish(model, layers, cfg)
    memory = {
        "device": str(device),
        "working_set_bytes": worst["total"],
        "block_bytes": worst["block"],
        "activation_bytes": worst["activations"],
        "statistics_bytes": worst["statistics"],
        "model_bytes": module_bytes(model),
        "device_peak_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "host_peak_rss_bytes": _peak_rss_bytes(),
    }
    return EngineReport(layers, time.perf_counter() - start, memory, block_seconds)
