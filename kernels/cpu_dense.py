"""Float linears for CPU serving in bf16: the weight reordered once into oneDNN's blocked layout.

``F.linear`` on a bf16 CPU weight kept in ``nn.Linear``'s row-major layout lets oneDNN re-lay it out (or
take a slow path) on every call; a decode step of one token per sequence reads every weight once, so that
cost is paid per token. ``torch.ops.mkldnn._reorder_linear_weight`` does the reordering once at load and
``mkldnn._linear_pointwise`` multiplies with the reordered weight. Measured on this project's 2-core AMD
Zen 4 (``python -m benchmarks.kernels.cpu --head``, one thread, one row, ``prepacked_bf16`` against
``dense_bf16``): the 50304 × 768 head of a 190M model 1.95× as fast as ``F.linear`` in bf16, the 768/2048
block shapes 1.7–2.3×. In fp32 the reordering gains little or nothing on the block shapes (``prepacked_fp32``;
MKL's packed GEMM helps only the head, and needs the original weight kept beside it), so only bf16 layers
are converted.

The product is oneDNN's bf16 GEMM either way (bf16 inputs, fp32 accumulation, one bf16 rounding of the
output), so a converted layer equals ``F.linear`` on the same bf16 weight within reassociation of the fp32
sums. Under ``torch.compile`` the call is an operator of our own, ``trilm::prepacked_linear``: inductor's
lowering of ``_linear_pointwise`` accepts only weights it prepacked itself (under ``freezing``, which in
a measurement here ran the 190M FloatLM's decode at 0.6× this path and keeps a second copy of every
weight), and our operator keeps the reordered weight opaque to it. Eagerly the module calls oneDNN directly:
the operator's Python dispatch costs a few µs a call.
"""

from __future__ import annotations

import torch
from torch import nn

_LIBRARY = torch.library.Library("trilm", "FRAGMENT")
_LIBRARY.define("prepacked_linear(Tensor x, Tensor packed, int out_features) -> Tensor")


def _prepacked_linear(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """x [..., K] bf16 @ the reordered weight [N, K]^T → [..., N] bf16."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, None, "none", [], "")


# A plain kernel registration, not ``torch.library.custom_op``: the latter wraps every call in autograd
# machinery (about 6 µs more a call, measured); the reordered weight's dispatch key is MkldnnCPU, hence
# the backend-independent key.
_LIBRARY.impl("prepacked_linear", _prepacked_linear, "CompositeExplicitAutograd")


@torch.library.register_fake("trilm::prepacked_linear")
def _(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], out_features))


def supported() -> bool:
    """Whether this build and CPU run oneDNN's bf16 linear (an AVX-512 BF16/AMX or AVX-512 core)."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


class PrepackedLinear(nn.Module):
    """A bias-free bf16 linear whose weight oneDNN reordered once; call it with bf16 activations.

    The reordered weight is an opaque oneDNN tensor, not a parameter or buffer: it cannot move devices or
    change dtype, and the module serves inference only (no ``state_dict`` round trip)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        if weight.dtype != torch.bfloat16 or weight.device.type != "cpu" or weight.dim() != 2:
            raise ValueError(
                f"PrepackedLinear takes a 2-D bf16 CPU weight, got {weight.dtype} {tuple(weight.shape)} "
                f"on {weight.device}"
            )
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16:
            raise TypeError(f"PrepackedLinear runs bf16 activations, got {x.dtype}")
        if torch.compiler.is_compiling():
            return torch.ops.trilm.prepacked_linear(x, self.packed, self.out_features)
        return _prepacked_linear(x, self.packed, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bf16 oneDNN-prepacked"


def prepack_float_linears(model: nn.Module, names: list[str]) -> int:
    """Replace the bf16 ``nn.Linear`` submodules ``names`` (dotted paths) of ``model`` by prepacked ones;
    returns how many were converted (0 where oneDNN's bf16 linear is unavailable)."""
    if not supported():
        return 0
    count = 0
    for name in names:
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        linear = getattr(parent, leaf)
        if type(linear) is nn.Linear and linear.bias is None and linear.weight.dtype == torch.bfloat16:
            setattr(parent, leaf, PrepackedLinear(linear.weight))
            count += 1
    return count
