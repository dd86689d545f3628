"""Post-hoc compression of float models: calibration, a block-wise engine, and the layer methods.

``quantize_layer(method, W, H, **cfg)`` is the per-layer contract; :data:`METHODS` holds every registered
layer method. See docs/posthoc.md.
"""

# The built-in methods register themselves on import: importing them with the package means every way in
# sees all of them, and the registries need not know their methods.
from trilm.posthoc import billm, binary_model, gptq, omniquant, pbllm, rtn  # noqa: F401
from trilm.posthoc.hessian import HessianAccumulator, inverse_cholesky_upper, prepare_hessian, proxy_loss
from trilm.posthoc.registry import (
    METHODS,
    LayerOptions,
    Method,
    MethodOptions,
    QuantResult,
    get_method,
    quantize_layer,
    register_method,
    run_layer_method,
)
from trilm.posthoc.uniform import UniformConfig

__all__ = [
    "METHODS",
    "HessianAccumulator",
    "LayerOptions",
    "Method",
    "MethodOptions",
    "QuantResult",
    "UniformConfig",
    "get_method",
    "inverse_cholesky_upper",
    "prepare_hessian",
    "proxy_loss",
    "quantize_layer",
    "register_method",
    "run_layer_method",
]
