"""Process groups and megatron-core parallel state, the same way under python, torchrun and deepspeed.

Why one module: every entry point (training, tests, conversion, notebooks) needs megatron-core's parallel
state initialised before a tensor-parallel layer can be built, even on one CPU. ``init_parallel`` does that
for a single process (an in-memory store, no ports) or for launcher-started ranks (``RANK``/``WORLD_SIZE``
in the environment), picks gloo on CPU and nccl on GPU, and hands DeepSpeed the names it asks for.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import sys
from typing import Literal

import torch
import torch.distributed as dist

from trilm.config import Config, require


@dataclasses.dataclass
class ParallelConfig(Config):
    """How the world is split: tensor parallel inside a model replica, data parallel across replicas."""

    tensor_parallel: int = 1
    """Tensor-parallel degree (megatron-core); must divide heads, kv heads, FFN and the padded vocab."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """Collective backend; auto = nccl when CUDA is available, else gloo."""
    sequence_parallel: bool = False
    """megatron-core's sequence parallelism (TP ≥ 2): norms and residuals hold 1/TP of the sequence, the
    all-reduce after each row-parallel linear becomes a reduce-scatter and the linears all-gather their
    input. Same results, 1/TP of the activation memory outside the tensor-parallel regions."""

    def validate(self) -> None:
        require(self.tensor_parallel >= 1, f"tensor_parallel: must be >= 1, got {self.tensor_parallel}")
        require(
            not self.sequence_parallel or self.tensor_parallel >= 2,
            "sequence_parallel: needs tensor_parallel >= 2 (there is nothing to split at TP=1)",
        )

    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "nccl" if torch.cuda.is_available() else "gloo"


@dataclasses.dataclass(frozen=True)
class ParallelInfo:
    """Where this process sits: global rank/size, tensor-parallel rank/size, data-parallel rank/size."""

    rank: int
    world_size: int
    tp_rank: int
    tp_size: int
    dp_rank: int
    dp_size: int
    device: torch.device
    sequence_parallel: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _mpu():
    from megatron.core import parallel_state

    return parallel_state


def init_parallel(cfg: ParallelConfig | None = None) -> ParallelInfo:
    """Initialise torch.distributed (if needed) and megatron-core's tensor/data-parallel groups.

    Idempotent: a second call with the same tensor-parallel degree returns the current layout; a different
    degree rebuilds the megatron groups (used by tests that compare TP=1 and TP=2 in one process group).
    """
    cfg = cfg or ParallelConfig()
    # megatron-core's async grad all-reduce asks for this; it is also what Megatron recommends on GPU.
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    backend = cfg.resolved_backend()
    if backend == "nccl" and not torch.cuda.is_available():
        raise RuntimeError("parallel.backend=nccl needs CUDA; use gloo on CPU")
    if not dist.is_initialized():
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            dist.init_process_group(backend=backend)
        else:
            if backend == "nccl":
                torch.cuda.set_device(0)
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    world = dist.get_world_size()
    if world % cfg.tensor_parallel != 0:
        raise RuntimeError(
            f"parallel.tensor_parallel={cfg.tensor_parallel} does not divide the world size {world}"
        )
    mpu = _mpu()
    if (
        mpu.model_parallel_is_initialized()
        and mpu.get_tensor_model_parallel_world_size() != cfg.tensor_parallel
    ):
        mpu.destroy_model_parallel()
    if not mpu.model_parallel_is_initialized():
        mpu.initialize_model_parallel(tensor_model_parallel_size=cfg.tensor_parallel)
    global _SEQUENCE_PARALLEL
    _SEQUENCE_PARALLEL = cfg.sequence_parallel and cfg.tensor_parallel > 1
    _destroy_at_exit()
    return current_parallel()


_SEQUENCE_PARALLEL = False
_EXIT_HOOK = False


def _destroy_at_exit() -> None:
    """Last line of defence: a process group still alive at interpreter exit is destroyed, with a warning.

    Entry points destroy their group themselves (:func:`shutdown_parallel`); a live NCCL group at exit makes
    the process hang in its destructor, which is what a leaked group looks like from outside.
    """
    global _EXIT_HOOK
    if _EXIT_HOOK:
        return
    _EXIT_HOOK = True

    def hook() -> None:
        if dist.is_available() and dist.is_initialized():
            print(
                "trilm: warning: a process group was still initialised at exit; destroying it "
                "(the entry point should call trilm.parallel.shutdown_parallel)",
                file=sys.stderr,
            )
            shutdown_parallel()

    atexit.register(hook)


def current_parallel() -> ParallelInfo:
    """The layout of an initialised process (see :func:`init_parallel`)."""
    mpu = _mpu()
    if not (dist.is_initialized() and mpu.model_parallel_is_initialized()):
        raise RuntimeError("parallel state is not initialised: call trilm.parallel.init_parallel() first")
    on_gpu = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    return ParallelInfo(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        tp_rank=mpu.get_tensor_model_parallel_rank(),
        tp_size=mpu.get_tensor_model_parallel_world_size(),
        dp_rank=mpu.get_data_parallel_rank(),
        dp_size=mpu.get_data_parallel_world_size(),
        device=device,
        sequence_parallel=_SEQUENCE_PARALLEL,
    )


def ensure_parallel(tensor_parallel: int = 1) -> ParallelInfo:
    """Initialise a default layout when nothing is initialised yet (scripts, notebooks, tests)."""
    mpu = _mpu()
    if dist.is_initialized() and mpu.model_parallel_is_initialized():
        info = current_parallel()
        if info.tp_size == tensor_parallel:
            return info
    return init_parallel(ParallelConfig(tensor_parallel=tensor_parallel))


def tp_group():
    return _mpu().get_tensor_model_parallel_group()


def dp_group():
    return _mpu().get_data_parallel_group()


def shutdown_parallel() -> None:
    """Tear down megatron groups and the default process group (entry points call this on the way out,
    tests between cases); a no-op when nothing is initialised."""
    global _SEQUENCE_PARALLEL
    _SEQUENCE_PARALLEL = False
    mpu = sys.modules.get("megatron.core.parallel_state")  # not imported: no megatron groups to tear down
    if mpu is not None and mpu.model_parallel_is_initialized():
        mpu.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


class DeepSpeedMPU:
    """The ``mpu=`` object DeepSpeed expects, backed by megatron-core's parallel state.

    DeepSpeed asks for ``get_model_parallel_*`` and ``get_data_parallel_*``; megatron-core names the former
    ``get_tensor_model_parallel_*``. Nothing else is needed for ZeRO-1/2 over a tensor-parallel model.
    """

    def get_model_parallel_rank(self) -> int:
        return _mpu().get_tensor_model_parallel_rank()

    def get_model_parallel_world_size(self) -> int:
        return _mpu().get_tensor_model_parallel_world_size()

    def get_model_parallel_group(self):
        return _mpu().get_tensor_model_parallel_group()

    def get_data_parallel_rank(self) -> int:
        return _mpu().get_data_parallel_rank()

    def get_data_parallel_world_size(self) -> int:
        return _mpu().get_data_parallel_world_size()

    def get_data_parallel_group(self):
        return _mpu().get_data_parallel_group()

    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_group = get_model_parallel_group


# ---- sequence parallelism ----------------------------------------------------------------------------------
# megatron-core's scheme (norms and residuals on a 1/t slice of the sequence, all-gather before each
# column-parallel linear, reduce-scatter after each row-parallel one); its mapping functions allocate on
# ``torch.cuda.current_device()`` and split dim 0 of an [s, b, h] layout, so these device-agnostic versions
# split the sequence dim of trilm's [b, s, h] activations and run the same collectives on gloo and nccl.


def gather_sequence(x: torch.Tensor, group) -> torch.Tensor:
    """All-gather ``x`` [b, s/t, …] along the sequence (dim 1) over ``group`` → [b, s, …] (no autograd)."""
    t = dist.get_world_size(group)
    if t == 1:
        return x
    src = x.transpose(0, 1).contiguous()
    out = torch.empty((src.shape[0] * t, *src.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, src, group=group)
    return out.transpose(0, 1)


def reduce_scatter_sequence(x: torch.Tensor, group) -> torch.Tensor:
    """Sum ``x`` [b, s, …] over ``group`` and keep this rank's sequence chunk [b, s/t, …] (no autograd)."""
    t = dist.get_world_size(group)
    if t == 1:
        return x
    src = x.transpose(0, 1).contiguous()
    if src.shape[0] % t:
        raise ValueError(f"sequence length {src.shape[0]} is not divisible by the tensor-parallel size {t}")
    out = torch.empty((src.shape[0] // t, *src.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(out, src, group=group)
    return out.transpose(0, 1)


def _sequence_chunk(x: torch.Tensor, group) -> torch.Tensor:
    t = dist.get_world_size(group)
    if x.shape[1] % t:
        raise ValueError(f"sequence length {x.shape[1]} is not divisible by the tensor-parallel size {t}")
    return x.chunk(t, dim=1)[dist.get_rank(group)].contiguous()


class _ScatterToSequence(torch.autograd.Function):
    """Forward: keep this rank's sequence chunk; backward: all-gather the gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _sequence_chunk(x, group)

    @staticmethod
    def backward(ctx, grad):
        return gather_sequence(grad, ctx.group).contiguous(), None


class _ReduceScatterToSequence(torch.autograd.Function):
    """Forward: reduce-scatter along the sequence; backward: all-gather the gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return reduce_scatter_sequence(x, group)

    @staticmethod
    def backward(ctx, grad):
        return gather_sequence(grad, ctx.group).contiguous(), None


class _AllReduceGrad(torch.autograd.Function):
    """Identity forward; backward sums the gradient over ``group`` (parameters used on a sequence slice)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def scatter_to_sequence_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    return _ScatterToSequence.apply(x, group or tp_group())


def reduce_scatter_to_sequence_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    return _ReduceScatterToSequence.apply(x, group or tp_group())


def all_reduce_grad(x: torch.Tensor, group=None) -> torch.Tensor:
    return _AllReduceGrad.apply(x, group or tp_group())
