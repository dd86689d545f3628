"""Low-bit Triton kernels for trilm's packed formats, their PyTorch references and ``QuantLinear``.

``from kernels import QuantLinear, replace_linears`` is all the model side needs. The kernels run on CUDA,
or on CPU under Triton's interpreter (``TRITON_INTERPRET=1``); elsewhere QuantLinear falls back to the
reference. This package shares its import name with Hugging Face's ``kernels`` distribution, which
transformers probes for; it defines no ``__version__`` so that probe finds no compatible version (tested
alongside transformers).
"""

from kernels.launch import GEMV_MAX_M, KernelWeight, interpreting, prepare, triton_matmul
from kernels.linear import QuantLinear, replace_linears, resolve_backend
from kernels.reference import reference_matmul

__all__ = [
    "GEMV_MAX_M",
    "KernelWeight",
    "QuantLinear",
    "interpreting",
    "prepare",
    "reference_matmul",
    "replace_linears",
    "resolve_backend",
    "triton_matmul",
]
