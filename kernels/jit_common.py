"""Triton helpers both kernel families use, and the format ids compiled into them.

Only core builtins are used — not the ``@jit`` helpers of ``triton.language.standard`` (``tl.sum``,
``tl.zeros``, ``tl.cdiv``): those are decorated when triton is first imported, so they break the interpreter
whenever ``TRITON_INTERPRET=1`` is set after that. :func:`trilm.kernels.triton_runtime.kernel_module`
re-imports this module (before the kernel modules) when ``TRITON_INTERPRET`` changes, because ``@triton.jit``
picks interpreter or compiler at import.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton import knobs

from trilm.formats import KernelId

INTERPRET = bool(knobs.runtime.interpret)

FMT_TERNARY = tl.constexpr(int(KernelId.TERNARY))
FMT_BINARY = tl.constexpr(int(KernelId.BINARY))
FMT_NM = tl.constexpr(int(KernelId.NM))
FMT_INT = tl.constexpr(int(KernelId.INT))
FMT_LUT = tl.constexpr(int(KernelId.LUT))


if INTERPRET:

    @triton.jit
    def reduce_sum(x, axis):
        """tl.sum through the core ``tl.reduce`` builtin (see the module docstring); with this combine
        function the interpreter takes its numpy fast path instead of reducing element by element."""
        return tl.reduce(x, axis, tl.standard._sum_combine)

else:

    @triton.jit
    def reduce_sum(x, axis):
        return tl.sum(x, axis=axis)


@triton.jit
def exact_float(c, dt: tl.constexpr, OFFSET: tl.constexpr):
    """c − OFFSET as exact floats of dt for small non-negative integer codes c, without an int→float
    conversion (a quarter-rate instruction): c is OR-ed into the mantissa of a power of two (2^23, 1024 or
    128 for fp32, fp16, bf16) whose value, plus OFFSET, one add then removes — one logic op and one add."""
    if dt == tl.float16:
        f = (c | 0x6400).to(tl.int16).to(tl.float16, bitcast=True) - (1024.0 + OFFSET)
    elif dt == tl.bfloat16:
        f = (c | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True) - (128.0 + OFFSET)
    else:
        f = (c | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + OFFSET)
    return f
