"""Serving: the inference engine (static KV cache, continuous batching, CUDA-graph decode, streaming)
and the OpenAI-compatible server over it.

::

    from trilm.serve import Engine, SamplingParams
    engine = Engine.load("path/to/snapshot")           # snapshot, packed snapshot (QuantLM) or HF directory
    [out] = engine.generate("Once upon a time", SamplingParams(max_tokens=32, temperature=0))
    print(out.text)

``trilm generate`` and ``trilm serve`` are the command-line entry points (docs/serving.md).
"""

from trilm.serve.engine import Completion, Delta, Engine, RequestError, RequestHandle
from trilm.serve.sampling import SamplingError, SamplingParams

__all__ = [
    "Completion",
    "Delta",
    "Engine",
    "RequestError",
    "RequestHandle",
    "SamplingError",
    "SamplingParams",
]
