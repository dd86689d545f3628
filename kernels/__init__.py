"""Low-bit kernels for trilm's packed formats, their PyTorch references and ``QuantLinear``.

``from kernels import QuantLinear, replace_linears`` is all the model side needs. The package has three
parts:

* **runtime dispatch** — :mod:`kernels.linear` (``QuantLinear``), :mod:`kernels.dispatch` (which backend a
  layer runs on, from its format's kernel id), :mod:`kernels.cpu` (torch's int4 CPU kernel),
  :mod:`kernels.cpu_dense` (float linears prepacked for oneDNN in bf16, for CPU serving),
  :mod:`kernels.reference` (the PyTorch reference), :mod:`kernels.triton_runtime`;
* **the Triton kernels per family** — :mod:`kernels.affine` (ternary, binary, int) and
  :mod:`kernels.general` (every format), with the helpers they share in :mod:`kernels.jit_common`. They run on
  CUDA, or on CPU under Triton's interpreter (``TRITON_INTERPRET=1``);
* **offline tools** — :mod:`kernels.tools` (ahead-of-time compilation and instruction counts for a GPU
  target without a GPU, random packed weights for tests and benchmarks).

This package shares its import name with Hugging Face's ``kernels`` distribution, which transformers probes
for; it defines no ``__version__`` so that probe finds no compatible version (tested alongside transformers).
"""

from kernels.affine.tuning import GEMV_MAX_M
from kernels.dispatch import BACKENDS, prepare, resolve_backend, triton_matmul
from kernels.general.launch import KernelWeight
from kernels.linear import QuantLinear, replace_linears
from kernels.reference import reference_matmul
from kernels.triton_runtime import interpreting

__all__ = [
    "BACKENDS",
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
