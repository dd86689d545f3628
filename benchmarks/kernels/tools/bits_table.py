"""Storage bits per weight of every packed format, as the Markdown table docs/kernels.md quotes (CPU).

    python -m benchmarks.kernels.tools.bits_table 4096x4096

For each sample kind of :mod:`trilm.formats.samples`: its codec, layout, storage bits per weight (every stored
tensor counted: codes, scales, metadata), the ideal ratio against fp16, and the nominal bits the method's
paper quotes (:mod:`trilm.bits`). Prints only; no result file.
"""

from __future__ import annotations

import argparse
import re

import trilm.bits
from trilm.formats.samples import KINDS, random_packed

BITS_NOMINAL = {  # value bits the method papers quote (computed by trilm.bits), where one exists
    "int2": ("gptq_bits", (2, 128)),
    "int3": ("gptq_bits", (3, 128)),
    "int4": ("gptq_bits", (4, 128)),
    "int4_act": ("gptq_bits", (4, 128)),
    "billm": ("billm_bits", (0.1,)),
    "stbllm": ("stbllm_bits", (0.1, 4, 8)),
    "pbllm": ("pbllm_bits", (0.1,)),
}


def nominal_bits(kind: str) -> str:
    """``gptq_bits(4, 128) = 4.156``: the paper's count for a sample kind, from trilm.bits."""
    if kind not in BITS_NOMINAL:
        return ""
    name, args = BITS_NOMINAL[kind]
    value = getattr(trilm.bits, name)(*args)
    return f"{name}({', '.join(map(str, args))}) = {value:.4g}"


BITS_LAYOUT = {
    "ternary": "2-bit codes, per-row fp32 scales (g = K)",
    "binary": "1-bit signs, per-row fp32 scales",
    "binary_mean": "1-bit signs, per-row fp32 scale and mean",
    "nm2:4": "keep-bitmap + 2 sign slots per 4, per-row fp32 scales",
    "nm4:8": "keep-bitmap + 4 sign slots per 8, per-row fp32 scales",
    "billm": "2 bit-planes, 2 column classes, fp16 table per 128 columns",
    "stbllm": "3 bit-planes (4:8 pruned), 2 classes, fp16 table per 128 columns",
    "int2": "2-bit, g128, fp16 scales, uint8 zeros",
    "int3": "2-bit + 1-bit planes, g128, fp16 scales, uint8 zeros",
    "int4": "4-bit, g128, fp16 scales, uint8 zeros",
    "int4_act": "int4 g128 with act-order g_idx",
    "pbllm": "1-bit + 10 % salient int8 (CSR, int16 columns), per-row tables",
}


def bits_table(shape: str) -> None:
    """Markdown table of storage bits/weight per sample kind (docs/kernels.md quotes it)."""
    k, n = (int(v) for v in shape.split("x"))
    print(
        f"| kind | format | layout | storage bits/weight | ideal vs fp16 | paper's nominal bits |  ({shape})"
    )
    print("|---|---|---|---|---|---|")
    for kind in KINDS:
        w = random_packed(kind, n, k)
        bits = w.bits_per_weight()
        row = (
            kind,
            f"`{w.FORMAT}`",
            BITS_LAYOUT[kind],
            f"{bits:.3f}",
            f"{16 / bits:.2f}x",
            nominal_bits(kind),
        )
        print("| " + " | ".join(row) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", nargs="?", default="4096x4096", help="KxN (in x out), default 4096x4096")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"\d+x\d+", args.shape):
        parser.error(f"{args.shape!r} is not KxN")
    bits_table(args.shape)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
