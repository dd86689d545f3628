"""Kernel launches per decoded token, counted on the CPU: eager (one per operator that does work) and
compiled (the kernels and external calls of inductor's generated step).

The H200 measurement found the one-token forward launch-bound (the bf16 1.1B FloatLM moved its 2.2 GB in
0.52 ms of copy time but took 2.25 ms in a CUDA graph), so the number of launches per layer is the figure a
decode step is judged by before any device is at hand. Eager: a dispatch mode counts every ATen operator
except views, aliases and allocations, and every Triton plan a :class:`~trilm.kernels.QuantLinear` runs.
Compiled: ``torch.compile``'s inductor output is read; each call in its step function that runs code — a
fused kernel, an external matmul, an operator fallback such as ``trilm::quant_linear`` — is one launch.
Inductor's CPU and CUDA back ends make the same fusion decisions on these graphs (pointwise and reduction
nodes around the same matmul boundaries), so the CPU count stands for the GPU's; a CUDA run replays the
same step in one graph.

Per layer = the difference between models of ``layers`` and ``2 × layers`` blocks, over ``layers``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trilm.infer.model import InferenceModel

_FREE = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "lift_fresh",
    "_unsafe_view",
}  # fmt: skip
_CALL = re.compile(
    r"^\s+(?:buf\w*\s*=\s*|\w+\s*=\s*)?(cpp_fused_\w+|triton_\w+\.run|extern_kernels\.\w+|torch\.ops\.\w+\.\w+)"
)


class _LaunchCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.inside_plan = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self.inside_plan and name not in _FREE and not func.is_view:
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


def eager_launches(model: InferenceModel, ids: torch.Tensor) -> list[str]:
    """The operators (and QuantLinear Triton plans, as ``quant_linear``) one forward of ``ids`` runs."""
    # deferred for start-up time: loads triton only when called
    from trilm.kernels import QuantLinear

    counter = _LaunchCounter()
    hooks = []

    def runs_plan(module, x) -> bool:
        return module.backend in ("auto", "triton") and (x.is_cuda or _interpreting())

    def enter(module, args):
        counter.inside_plan = runs_plan(module, args[0])

    def leave(module, args, out):
        if counter.inside_plan:  # one launch on a GPU, whatever the interpreter ran to emulate it
            counter.ops.append("quant_linear")
        counter.inside_plan = False

    for m in model.modules():
        if isinstance(m, QuantLinear):
            hooks += [m.register_forward_pre_hook(enter), m.register_forward_hook(leave)]
    try:
        with torch.no_grad(), counter:
            model(ids)
    finally:
        for h in hooks:
            h.remove()
    return counter.ops


def compiled_launches(model: InferenceModel, ids: torch.Tensor) -> list[str]:
    """The calls of inductor's step function for ``model(ids)`` compiled whole (``fullgraph=True``)."""
    from torch._inductor.utils import run_and_get_code  # deferred for start-up time: inductor takes seconds

    torch._dynamo.reset()
    step = torch.compile(model, fullgraph=True, dynamic=False)
    with torch.no_grad():
        _, codes = run_and_get_code(step, ids)
    calls: list[str] = []
    for code in codes:
        body = code.split("def call(", 1)[-1].split("\ndef ", 1)[0]
        calls += [m.group(1) for line in body.splitlines() if (m := _CALL.match(line))]
    return calls


def per_layer(
    count: Callable[[InferenceModel], int], build: Callable[[int], InferenceModel], layers: int = 2
):
    """(launches per layer, launches outside the layers) from models of ``layers`` and ``2·layers`` blocks."""
    small, large = count(build(layers)), count(build(2 * layers))
    each = (large - small) / layers
    return each, small - each * layers


def _interpreting() -> bool:
    # deferred for start-up time: loads triton only when called
    from trilm.kernels import interpreting

    return interpreting()
