"""Process groups and megatron-core parallel state, the same way under python, torchrun and deepspeed.

Why one module: every entry point (training, tests, conversion, notebooks) needs megatron-core's parallel
state initialised before a tensor-parallel layer can be built, even on one CPU. ``init_parallel`` does that
for a single process (an in-memory store, no ports) or for launcher-started ranks (``RANK``/``WORLD_SIZE``
in the environment), picks gloo on CPU and nccl on GPU, and hands DeepSpeed the names it asks for.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import os
import socket
import sys
import warnings
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
    collective_timeout: float = 600.0
    """Seconds a collective (and the rendezvous at start) waits for its peers before this rank gives up:
    the longest a dead or hung node can stall the others. On NCCL, a rank whose peer died hangs inside
    the collective until then, and the watchdog then tears the process down; on gloo, a peer whose
    process died is noticed at once (connection reset), a frozen one after this long. Must exceed the
    longest time one rank works while the others wait in a barrier: writing a state, converting one
    to a universal checkpoint on resume."""

    def validate(self) -> None:
        require(self.tensor_parallel >= 1, f"tensor_parallel: must be >= 1, got {self.tensor_parallel}")
        require(
            self.collective_timeout > 0,
            f"collective_timeout: must be > 0 seconds, got {self.collective_timeout}",
        )
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
    # deferred for start-up time: loads megatron only when called
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
    timeout = datetime.timedelta(seconds=cfg.collective_timeout)
    if not dist.is_initialized():
        if backend == "nccl":
            enable_nccl_async_error_handling()
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            dist.init_process_group(backend=backend, timeout=timeout)
        else:
            if backend == "nccl":
                torch.cuda.set_device(0)
            dist.init_process_group(
                backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
            )
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
        # The groups get the same timeout as the world; no gloo copies of the groups (unused: DeepSpeed
        # owns data parallelism, and on CPU every group is gloo already).
        mpu.initialize_model_parallel(
            tensor_model_parallel_size=cfg.tensor_parallel,
            distributed_timeout_minutes=cfg.collective_timeout / 60,
            create_gloo_process_groups=False,
        )
    global _SEQUENCE_PARALLEL
    _SEQUENCE_PARALLEL = cfg.sequence_parallel and cfg.tensor_parallel > 1
    _destroy_at_exit()
    return current_parallel()


_SEQUENCE_PARALLEL = False
_EXIT_HOOK = False

NCCL_ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"


def enable_nccl_async_error_handling() -> None:
    """Make a failed or timed-out NCCL collective end the process instead of hanging it.

    NCCL kernels do not return when a peer dies; only the watchdog thread notices, once the collective
    has waited ``parallel.collective_timeout``, and with async error handling it then tears the process
    down, so the launcher sees a failed rank and stops the node. Mode 3 (torch's default, made explicit
    here so that a site-wide setting cannot switch it off unnoticed) exits without aborting the
    communicators first, since ``ncclCommAbort`` itself can hang when a peer is gone; 1 aborts them
    first. 0 and 2 leave a rank whose peer died waiting until the job's time limit, hence the warning.
    """
    value = os.environ.setdefault(NCCL_ASYNC_ERROR_HANDLING, "3")
    if value.strip() in ("0", "2"):
        warnings.warn(
            f"{NCCL_ASYNC_ERROR_HANDLING}={value} in the environment: a rank whose peer dies will hang in "
            "its collective until the job's time limit instead of exiting after "
            "parallel.collective_timeout (unset it, or set 3)",
            RuntimeWarning,
            stacklevel=2,
        )


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


# The launcher tells a process which node it runs on: torchrun GROUP_RANK, the DeepSpeed launcher
# CROSS_RANK, srun SLURM_NODEID. Started by hand (python, multiprocessing) nothing does: the host stands in.
NODE_VARIABLES = ("GROUP_RANK", "CROSS_RANK", "SLURM_NODEID")


def node_id() -> str:
    for var in NODE_VARIABLES:
        value = os.environ.get(var, "")
        if value != "":
            return value
    return socket.gethostname()


def placement(info: ParallelInfo) -> dict:
    """Which ranks run on which node (collective: every rank reports its node), and whether a
    tensor-parallel group crosses nodes. TP all-reduces run inside every layer, so they belong inside a
    node's fast interconnect; megatron-core gives a TP group consecutive ranks, and launchers number the
    ranks node by node, so TP stays inside a node when the processes per node are a multiple of TP."""
    mine = {"rank": info.rank, "node": node_id(), "host": socket.gethostname(), "dp_rank": info.dp_rank}
    everyone: list[dict | None] = [mine]
    if info.world_size > 1:
        everyone = [None] * info.world_size
        dist.all_gather_object(everyone, mine)
    nodes: dict[str, list[int]] = {}
    hosts: dict[str, str] = {}
    tp_nodes: dict[int, set[str]] = {}
    for entry in everyone:
        assert entry is not None  # all_gather_object filled every slot
        nodes.setdefault(entry["node"], []).append(entry["rank"])
        hosts[entry["node"]] = entry["host"]
        tp_nodes.setdefault(entry["dp_rank"], set()).add(entry["node"])
    return {
        "nodes": nodes,
        "hosts": hosts,
        "tensor_parallel_spans_nodes": any(len(n) > 1 for n in tp_nodes.values()),
    }


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
