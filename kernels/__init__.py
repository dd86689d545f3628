"""Low-bit kernels for trilm's packed formats, their PyTorch references and ``QuantLinear``.

``from trilm.kernels import QuantLinear, replace_linears`` is all the model side needs. The package has three
parts:

* **runtime dispatch** — :mod:`trilm.kernels.linear` (``QuantLinear``), :mod:`trilm.kernels.dispatch`
  (which backend a layer runs on, from its format's kernel id), :mod:`trilm.kernels.cpu` (torch's int4 CPU
  kernel), :mod:`trilm.kernels.cpu_dense` (float linears prepacked for oneDNN in bf16, for CPU serving),
  :mod:`trilm.kernels.reference` (the PyTorch reference), :mod:`trilm.kernels.triton_runtime`;
* **the Triton kernels per family** — :mod:`trilm.kernels.affine` (ternary, binary, int) and
  :mod:`trilm.kernels.general` (every format), with the helpers they share in
  :mod:`trilm.kernels.jit_common`. They run on CUDA, or on CPU under Triton's interpreter
  (``TRITON_INTERPRET=1``);
* **offline checks, never imported at run time** — :mod:`trilm.kernels.aot` (the kernels compiled for a GPU
  target without a GPU), :mod:`trilm.kernels.launch_model` (occupancy and bytes in flight of a launch) and
  :mod:`trilm.kernels.launch_plans` (the table of the default plans the model judges).

The source folder is the repository's top-level ``kernels/``; it installs as ``trilm.kernels`` because the
top-level name ``kernels`` belongs to Hugging Face's distribution, which transformers probes for.
"""

from trilm.kernels.affine.tuning import GEMV_MAX_M
from trilm.kernels.dispatch import BACKENDS, prepare, resolve_backend, triton_matmul
from trilm.kernels.general.launch import KernelWeight
from trilm.kernels.linear import QuantLinear, replace_linears
from trilm.kernels.reference import reference_matmul
from trilm.kernels.triton_runtime import interpreting

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
