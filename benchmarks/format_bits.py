"""Storage bits per weight of every packed format at a LLaMA shape, next to the papers' nominal counts.

Launch: ``python benchmarks/format_bits.py [--shape 4096x4096]`` (CPU, under a minute). Prints a Markdown
table; docs/kernels.md quotes it. Storage bits = every stored tensor (codes, scales, zeros, masks, indices,
tables) divided by N·K; the ideal batch-1 speedup over fp16 is 16 / bits (bandwidth bound).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

NOMINAL = {  # the value bits the method papers quote (trilm.formats.accounting), where one exists
    "int2": "gptq_bits(2, 128) = 2.141",
    "int3": "gptq_bits(3, 128) = 3.148",
    "int4": "gptq_bits(4, 128) = 4.156",
    "int4_act": "gptq_bits(4, 128) = 4.156",
    "billm": "billm_bits(0.1) = 1.1",
    "stbllm": "stbllm_bits(0.1, 4, 8) = 0.55",
    "pbllm": "pbllm_bits(0.1) = 2.7",
}
SETTINGS = {
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="4096x4096", help="KxN (in x out)")
    args = parser.parse_args(argv)
    k, n = (int(v) for v in args.shape.split("x"))
    from kernels.samples import KINDS, random_packed

    print(
        f"| kind | format | layout | storage bits/weight | ideal vs fp16 | paper's nominal bits |  ({k}x{n})"
    )
    print("|---|---|---|---|---|---|")
    for kind in KINDS:
        w = random_packed(kind, n, k)
        bits = w.bits_per_weight()
        row = (
            kind,
            f"`{w.FORMAT}`",
            SETTINGS[kind],
            f"{bits:.3f}",
            f"{16 / bits:.2f}x",
            NOMINAL.get(kind, ""),
        )
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
