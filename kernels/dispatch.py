"""Runtime dispatch: which backend runs a packed layer, and the per-layer state each backend prepares.

Backends:

* ``triton`` — CUDA, or Triton's CPU interpreter (``TRITON_INTERPRET=1``): the affine kernels
  (:mod:`trilm.kernels.affine`) for decodes that have an affine form, the general kernels
  (:mod:`trilm.kernels.general`) for the rest;
* ``cpu`` — torch's weight-only int4 CPU kernel for affine weights with bf16 activations, every other case
  dequantized once (:mod:`trilm.kernels.cpu`);
* ``torch`` — the reference: dequantize with the codec and matmul, per call (:mod:`trilm.kernels.reference`).

The choice reads the weight's own :meth:`~trilm.formats.PackedWeight.decode_args` (its kernel id and tensors
by role); nothing here asks which class a weight is.
"""

from __future__ import annotations

from typing import Any

import torch
from trilm.kernels.affine import plan as affine
from trilm.kernels.general.launch import KernelWeight, general_matmul
from trilm.kernels.triton_runtime import interpreting

from trilm.formats import PackedWeight

BACKENDS = ("auto", "triton", "cpu", "torch")


def resolve_backend(backend: str, x: torch.Tensor) -> str:
    """'auto' → 'triton' on CUDA or under the CPU interpreter, 'cpu' on other CPUs, else the named one."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "cpu" and x.device.type != "cpu":
        raise ValueError(f"backend 'cpu' runs CPU tensors; this input is on {x.device}")
    if backend != "auto":
        return backend
    if x.is_cuda or interpreting():
        return "triton"
    return "cpu" if x.device.type == "cpu" else "torch"


def prepare(weight: PackedWeight, *, general: bool = False) -> KernelWeight:
    """A packed weight of any format as Triton kernel arguments (no copies of the big tensors).

    Weights with an affine decode also get their affine form (``.affine``), which :func:`triton_matmul`
    prefers; ``general=True`` leaves it out, so the general kernels serve every format (the baseline the
    benchmark and the instruction counts compare against), except an int weight with mins, which only the
    affine kernels decode. Compact storage formats (``partial_binary``, ``residual_binary``) are converted
    once to their kernel layout (``PackedWeight.kernel_layout``)."""
    args = weight.kernel_layout().decode_args()
    kw = KernelWeight.from_args(args)
    if not general:
        kw.affine = affine.AffineSpec.from_args(args)
    if kw.affine is None and args.zeros is not None and args.means is not None:
        raise ValueError(  # the general kernels read one offset table: zeros or means, not both
            f"{weight.FORMAT}: zero points and means (llama.cpp Q4_1's mins) run on the affine kernels only"
            + ("; prepare it without general=True" if general else f" (group size {args.group_size})")
        )
    return kw


def triton_matmul(
    x: torch.Tensor,
    kw: KernelWeight,
    *,
    path: str | None = None,
    config: dict[str, Any] | None = None,
    accumulate: str = "fp32",
) -> torch.Tensor:
    """x (M, K) @ W^T → (M, N) in x's dtype: the affine kernels when ``kw.affine`` is set, else the general
    GEMV (small M) or GEMM.

    ``config`` pins a launch config (tests sweep them); ``accumulate="native"`` lets the general kernels'
    fp16 GEMV/split-K partials be added atomically straight into the fp16 output (one kernel instead of
    zero + kernel + cast), at the cost of fp16 rounding per partial.
    """
    if x.dim() != 2 or x.shape[1] != kw.k:
        raise ValueError(f"expected x of shape (M, {kw.k}), got {tuple(x.shape)}")
    if x.device != kw.w0.device:
        raise ValueError(f"x is on {x.device} but the packed weight is on {kw.w0.device}")
    if x.device.type != "cuda" and not interpreting():
        raise RuntimeError(
            "Triton on CPU needs TRITON_INTERPRET=1 (set before launching); or use backend='cpu' or 'torch'"
        )
    if x.shape[0] == 0:
        return torch.zeros((0, kw.n), dtype=x.dtype, device=x.device)
    if kw.affine is not None:
        return affine.affine_matmul(x, kw.affine, path=path, config=config)
    return general_matmul(x, kw, path=path, config=config, accumulate=accumulate)
