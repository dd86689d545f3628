"""The DeepSpeed engine over the megatron-core tensor-parallel model.

DeepSpeed owns data parallelism (ZeRO 0/1/2, gradient all-reduce, clipping, bf16 master weights);
megatron-core owns tensor parallelism inside the model; :class:`trilm.parallel.DeepSpeedMPU` tells
DeepSpeed which ranks form a model replica. Gradient accumulation is *unmanaged*: the trainer calls
``backward`` per micro-batch and ``step`` once, so a step whose loss is not finite can be dropped without
DeepSpeed's counters going out of phase.
"""

from __future__ import annotations

import logging
import os

import torch

from trilm.model.quant import set_fused_quantizer
from trilm.parallel import DeepSpeedMPU, ParallelInfo
from trilm.train.config import TrainConfig


def use_bf16(cfg: TrainConfig) -> bool:
    if cfg.precision == "auto":
        return torch.cuda.is_available()
    return cfg.precision == "bf16"


def deepspeed_config(cfg: TrainConfig, accumulation: int, dp_size: int, load_universal: bool = False) -> dict:
    return {
        "checkpoint": {"load_universal": load_universal},
        "train_micro_batch_size_per_gpu": cfg.micro_batch,
        "gradient_accumulation_steps": accumulation,
        "train_batch_size": cfg.micro_batch * accumulation * dp_size,
        "gradient_clipping": cfg.optim.grad_clip,
        "zero_optimization": {"stage": cfg.zero_stage},
        "bf16": {"enabled": use_bf16(cfg)},
        "managed_gradient_accumulation": False,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
        "dump_state": False,
    }


def use_fused_adamw(cfg: TrainConfig, device: torch.device) -> bool:
    return cfg.optim.fused if cfg.optim.fused is not None else device.type == "cuda"


def prepare_model(model, cfg: TrainConfig, device: torch.device | str | None = None) -> None:
    """The per-run levers that do not change results: activation recompute, compiled blocks and quantizer.

    ``compile: auto`` is resolved for ``device`` (default: where the model's parameters are), so a model
    prepared on the host before it moves to the GPU passes the GPU."""

    compiled = cfg.compile_on(device if device is not None else next(model.parameters()).device)
    model.set_recompute(cfg.recompute)
    set_fused_quantizer(cfg.fused_quantizer and not compiled and model.cfg.family != "floatlm")
    if compiled:
        for block in model.layers:
            block.compile(dynamic=False)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Matrices decay, vectors (norm gains) do not; the trainer rewrites lr/weight_decay every step.

    Under μP (``model.cfg.mup_base_width``) the matrices other than the embedding form a group of their own
    whose learning rate is scaled by ``lr_scale`` = 1/m; the standard parametrization has two groups, decay
    and no decay, the layout of every optimizer state it writes and resumes.
    """
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    cfg = getattr(model, "cfg", None)
    if cfg is None or not cfg.mup_base_width:
        return [
            {"params": decay, "weight_decay": weight_decay, "decays": True},
            {"params": no_decay, "weight_decay": 0.0, "decays": False},
        ]
    embedding = {id(p) for p in model.embed.parameters()}
    return [
        {"params": [p for p in decay if id(p) in embedding], "weight_decay": weight_decay, "decays": True},
        {
            "params": [p for p in decay if id(p) not in embedding],
            "weight_decay": weight_decay,
            "decays": True,
            "lr_scale": 1.0 / cfg.width_multiplier,
        },
        {"params": no_decay, "weight_decay": 0.0, "decays": False},
    ]


def skip_shared_memory_comm_build() -> None:
    """Keep DeepSpeed from JIT-compiling its CPU shared-memory all-reduce op.

    Training communicates through torch.distributed, so the op is never used; building it costs a
    C++ compile on every fresh machine, and a process killed mid-build leaves a lock file behind
    that makes every later run wait on it forever. DeepSpeed caches the compatibility table in
    one dict, so marking the op incompatible there is honoured by ``deepspeed.initialize``.
    """
    # deferred for start-up time: loads deepspeed only when called
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def build_engine(
    model: torch.nn.Module,
    cfg: TrainConfig,
    accumulation: int,
    info: ParallelInfo,
    load_universal: bool = False,
):
    """``load_universal``: the state to load is a universal checkpoint (a resume at another DP size)."""
    # deferred for start-up time: loads deepspeed only when called
    import deepspeed
    from deepspeed.runtime.utils import clip_grad_norm_

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    skip_shared_memory_comm_build()
    os.environ.setdefault("LOCAL_RANK", "0")
    fused = use_fused_adamw(cfg, info.device)
    optimizer = torch.optim.AdamW(
        param_groups(model, cfg.optim.weight_decay),
        lr=cfg.optim.lr,
        betas=(cfg.optim.beta1, cfg.optim.beta2),
        eps=cfg.optim.eps,
        fused=fused,
        foreach=None if fused else True,
    )
    engine, *_ = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        config=deepspeed_config(cfg, accumulation, info.dp_size, load_universal),
        mpu=DeepSpeedMPU(),
    )
    if cfg.zero_stage == 0 and not use_bf16(cfg) and cfg.optim.grad_clip > 0:
        # DeepSpeed's fp32 stage-0 path clips but drops the norm; keep it so it can be logged.
        def clip_and_record():
            engine._global_grad_norm = clip_grad_norm_(
                parameters=engine.module.parameters(), max_norm=cfg.optim.grad_clip, mpu=engine.mpu
            )

        engine.clip_fp32_gradients = clip_and_record
    return engine


def set_optimizer_hparams(engine, lr: float, weight_decay: float) -> None:
    for group in engine.optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
        group["weight_decay"] = weight_decay if group.get("decays", True) else 0.0


def discard_gradients(engine) -> None:
    """Forget the gradients accumulated in this step (used when a micro-batch loss was not finite)."""
    engine.optimizer.zero_grad()
    engine.zero_grad()
    if hasattr(engine, "_unmanaged_backward_count"):
        engine._unmanaged_backward_count = 0


def global_grad_norm(engine) -> float | None:
    norm = engine.get_global_grad_norm()
    if norm is None:
        return None
    return float(norm)
