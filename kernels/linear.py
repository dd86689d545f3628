"""``QuantLinear``: one module for every packed format, dispatching to the kernel for its format.

The model code swaps its linears for QuantLinear (see :func:`replace_linears`) and does not care which
format a layer has: forward is ``x @ W^T (+ bias)`` for x of shape (..., K), on the backend
:func:`trilm.kernels.dispatch.resolve_backend` picks. The packed tensors are buffers,
so ``.to(device)``, ``state_dict()`` and ``load_state_dict()`` work as usual; the format's meta travels as
the module's extra state, and loading a state dict of another format or shape rebuilds the buffers.
Inference only: the Triton path has no backward.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from trilm.kernels.affine import plan as plans
from trilm.kernels.cpu import CpuLinearState
from trilm.kernels.dispatch import BACKENDS, prepare, resolve_backend, triton_matmul
from trilm.kernels.general.launch import GENERAL_GEMV_MAX_M, KernelWeight
from trilm.kernels.triton_runtime import interpreting

from trilm.formats import FORMATS, IntWeight, PackedWeight, from_tensors

_LAYERS: weakref.WeakValueDictionary[str, QuantLinear] = weakref.WeakValueDictionary()
_layer_ids = itertools.count()


@torch.library.custom_op("trilm::quant_linear", mutates_args=())
def quant_linear_op(x: torch.Tensor, layer: str) -> torch.Tensor:
    """The Triton forward of the QuantLinear registered as ``layer``, as one operator ``torch.compile`` can
    put in a graph: dynamo cannot trace the plan's raw kernel launch, so inside a compiled decode step the
    layer is this opaque call (one launch) and inductor fuses the norm, rotary, residual and SwiGLU work
    around it. The layer is named by a string, as vLLM names attention layers in its custom ops: an
    operator's arguments are tensors and plain values, not modules."""
    return _LAYERS[layer]._forward_triton(x)


@quant_linear_op.register_fake
def _quant_linear_shape(x: torch.Tensor, layer: str) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], _LAYERS[layer].out_features))


class QuantLinear(nn.Module):
    """A linear layer whose weight is a :class:`~trilm.formats.PackedWeight` of any format."""

    def __init__(
        self,
        packed: PackedWeight,
        bias: torch.Tensor | None = None,
        *,
        backend: str = "auto",
        cache_dequantized: bool = False,
        accumulate: str = "fp32",
        gemv_max_m: int = GENERAL_GEMV_MAX_M,
    ) -> None:
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if accumulate not in ("fp32", "native"):
            raise ValueError(f"accumulate must be 'fp32' or 'native', got {accumulate!r}")
        self.backend = backend
        self.cache_dequantized = cache_dequantized
        self.accumulate = accumulate
        self.gemv_max_m = gemv_max_m
        self._set_packed(packed)
        self._register_op()
        if bias is not None and tuple(bias.shape) != (packed.out_features,):
            raise ValueError(f"bias must have shape ({packed.out_features},), got {tuple(bias.shape)}")
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    # -- construction ---------------------------------------------------------------------------------------
    @classmethod
    def from_packed(
        cls, packed: PackedWeight, bias: torch.Tensor | None = None, **kwargs: Any
    ) -> QuantLinear:
        return cls(packed, bias, **kwargs)

    @classmethod
    def from_float(
        cls, weight: torch.Tensor, format: str, bias: torch.Tensor | None = None, **opts: Any
    ) -> QuantLinear:
        """Quantize a float weight (N, K) to an int format: ``format="int"``, opts bits, group_size, sym.

        Ternary and binary weights come from the model as codes and scales (``TernaryWeight.pack``), never
        from re-quantizing floats here."""
        if format != "int":
            raise ValueError(
                f"from_float builds the int formats (GPTQ/OmniQuant grid) only, got {format!r}; pack "
                "ternary, binary and the other formats from their codes (e.g. TernaryWeight.pack) and use "
                "from_packed"
            )
        module_opts = {k: opts.pop(k) for k in ("backend", "cache_dequantized", "accumulate") if k in opts}
        packed = IntWeight.from_float(weight.detach(), **opts)
        return cls(packed, bias, **module_opts)

    def _register_op(self) -> None:
        """A name of its own for :func:`quant_linear_op` (a copy or an unpickled layer gets a new one)."""
        self.op_name = f"quant_linear_{next(_layer_ids)}"
        _LAYERS[self.op_name] = self

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._register_op()

    def _set_packed(self, packed: PackedWeight) -> None:
        for name in list(self._buffers):
            if name != "bias":
                del self._buffers[name]
        for name, tensor in packed.to_tensors().items():
            self.register_buffer(name, tensor)
        self._meta = {k: v for k, v in packed.meta().items() if k != "bits_per_weight"}
        self.in_features = packed.in_features
        self.out_features = packed.out_features
        self._reset_caches()

    def _reset_caches(self) -> None:
        self._packed_cache: PackedWeight | None = None
        self._kernel_cache: KernelWeight | None = None
        self._plans: dict[tuple[int, torch.dtype, torch.device], Any] = {}
        self._dequant_cache: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
        self._cpu_state: CpuLinearState | None = None

    @property
    def format(self) -> str:
        return self._meta["format"]

    @property
    def packed(self) -> PackedWeight:
        """The packed weight viewed over this module's current buffers."""
        if self._packed_cache is None:
            names = (*FORMATS[self.format].TENSORS, *FORMATS[self.format].OPTIONAL_TENSORS)
            tensors = {n: self._buffers[n] for n in names if self._buffers.get(n) is not None}
            self._packed_cache = from_tensors(tensors, self._meta)
        return self._packed_cache

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self._reset_caches()
        return out

    # -- forward ------------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., K) → (..., N). Ternary, binary and int layers on Triton make one kernel launch per call
        (bias included) through a plan built on the first call for each (rows, dtype, device)."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"{self}: expected input with last dim {self.in_features}, got {tuple(x.shape)}")
        if self.backend in ("auto", "triton") and (x.is_cuda or interpreting()):
            if torch.compiler.is_compiling():
                return quant_linear_op(x, self.op_name)
            return self._forward_triton(x)
        return self._forward_other(x)

    def _forward_triton(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        plan = self._plans.get((x2.shape[0], x.dtype, x.device))
        if plan is not None:
            return plan(x2.contiguous(), self.bias).view(*x.shape[:-1], self.out_features)
        return self._forward_other(x)

    def _forward_other(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        backend = resolve_backend(self.backend, x)
        if backend == "torch":
            y = F.linear(x, self._dequantized(x))
            return y if self.bias is None else y + self.bias.to(y.dtype)
        if backend == "cpu":
            y = self.prepare_cpu()(x2).view(*x.shape[:-1], self.out_features)
            return y if self.bias is None else y + self.bias.to(y.dtype)
        if self._kernel_cache is None:
            self._kernel_cache = prepare(self.packed)
        kw = self._kernel_cache
        m = x2.shape[0]
        if kw.affine is not None and m and plans.affine_path(m) != "cublas":
            plan = plans.make_plan(kw.affine, plans.affine_path(m), m, x.dtype)
            self._plans[(m, x.dtype, x.device)] = plan
            return plan(x2.contiguous(), self.bias).view(*x.shape[:-1], self.out_features)
        path = "gemv" if m <= self.gemv_max_m else "gemm"
        y = triton_matmul(x2, kw, path=None if kw.affine is not None else path, accumulate=self.accumulate)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def prepare_cpu(self, dtype: torch.dtype | None = None) -> CpuLinearState:
        """The CPU backend's state (int4 kernel layout, dense copies), converted once and kept until the
        buffers move or change; call it at load, with the activations' ``dtype``, so the first forward does
        not pay for it."""
        if self._cpu_state is None:
            self._cpu_state = CpuLinearState(self.packed)
        if dtype is not None:
            self._cpu_state.prepare(dtype)
        return self._cpu_state

    def _dequantized(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype if x.is_floating_point() else torch.float32
        key = (x.device, dtype)
        if key in self._dequant_cache:
            return self._dequant_cache[key]
        w = self.packed.dequantize(torch.float32).to(device=x.device, dtype=dtype)
        if self.cache_dequantized:
            self._dequant_cache[key] = w
        return w

    # -- state dict -----------------------------------------------------------------------------------------
    def get_extra_state(self) -> dict[str, Any]:
        return dict(self._meta)

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self._meta = dict(state)
        self._reset_caches()

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        meta = state_dict.get(prefix + "_extra_state")
        if isinstance(meta, dict) and meta.get("format") in FORMATS:
            cls = FORMATS[meta["format"]]
            incoming = {
                n: state_dict[prefix + n]
                for n in (*cls.TENSORS, *cls.OPTIONAL_TENSORS)
                if isinstance(state_dict.get(prefix + n), torch.Tensor)
            }
            try:
                packed = from_tensors(incoming, meta)
            except ValueError as exc:
                error_msgs.append(f"{prefix or 'QuantLinear'}: {exc}")
                return
            self._set_packed(packed)
            bias = state_dict.get(prefix + "bias")
            if bias is not None and self.bias is None:
                self.register_buffer("bias", torch.empty_like(bias))
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        self._reset_caches()

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, format={self.format}, "
            f"bits_per_weight={self.packed.bits_per_weight():.3f}, bias={self.bias is not None}"
        )


def replace_linears(
    module: nn.Module,
    select_fn: Callable[[str, nn.Module], bool],
    make_quant_linear: Callable[[str, nn.Module], nn.Module],
) -> list[str]:
    """Replace each submodule where ``select_fn(qualified_name, child)`` holds by ``make_quant_linear(...)``.

    Works on any ``nn.Linear``-like child (the selector decides), in place; returns the replaced names in
    module order. Children of a replaced module are not visited.
    """
    replaced: list[str] = []

    def visit(parent: nn.Module, prefix: str) -> None:
        for name, child in list(parent.named_children()):
            qualified = f"{prefix}{name}"
            if select_fn(qualified, child):
                setattr(parent, name, make_quant_linear(qualified, child))
                replaced.append(qualified)
            else:
                visit(child, qualified + ".")

    visit(module, "")
    return replaced
