"""Which CPU kernel serves packed layers: torch's weight-only low-bit kernels against dense matmuls, one run.

    python -m benchmarks.kernels.cpu --out benchmarks/results            # 190m layer shapes, 1 and 2 threads

For each block-linear shape of a model (default ``trilm-190m``: 768→768, 768→2048, 2048→768) at batch 1 and
4, times ``y = x @ W^T`` by:

* ``dense_fp32`` / ``dense_bf16`` — ``F.linear`` on the float weight (what not packing costs, and what the
  engine's float layers run);
* ``prepacked_fp32`` / ``prepacked_bf16`` — the same product with the weight reordered once for MKL / oneDNN
  (``mkl._mkl_linear``, ``mkldnn._linear_pointwise``): what weight prepacking would give the float layers;
* ``int4_bf16`` / ``int4_fp32`` — ``aten._weight_int4pack_mm_for_cpu`` with bf16 / fp32 activations (the
  layout :mod:`trilm.kernels.cpu` converts ternary, binary and int2–4 weights to);
* ``int8_bf16`` / ``int8_fp32`` — ``aten._weight_int8pack_mm`` (per-channel int8);
* ``unpack_fp32`` — dequantize the ternary codes on every call, then ``F.linear``: a packed layer without a
  low-bit kernel.

torchao's CPU int4 weight-only layout calls ``_weight_int4pack_mm_for_cpu`` itself, so it is this row.
Rounds alternate the kernels; the median of ``--rounds`` counts. Prints a table with each kernel's time and
its speed-up over ``dense_fp32`` and ``dense_bf16``, and writes JSON.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from trilm.kernels.cpu import Int4Weight
from trilm.kernels.cpu_dense import supported as bf16_prepack_supported

from benchmarks.common import today, write_result
from trilm.formats import TernaryWeight
from trilm.model import preset


def kernels_for(n: int, k: int, m: int, seed: int = 0) -> dict[str, callable]:
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(-1, 2, (n, k), generator=gen, dtype=torch.int8)
    ternary = TernaryWeight.pack(codes, torch.full((1, n), 0.02))
    w32 = ternary.dequantize(torch.float32)
    wb = w32.to(torch.bfloat16)
    x32 = torch.randn(m, k, generator=gen)
    xb = x32.to(torch.bfloat16)
    int4 = Int4Weight.convert(ternary)
    mkl = torch.ops.mkl._mkl_reorder_linear_weight(w32, m)
    w8 = codes.contiguous()
    s8 = torch.full((n,), 0.02)
    fns = {
        "dense_fp32": lambda: F.linear(x32, w32),
        "dense_bf16": lambda: F.linear(xb, wb),
        "prepacked_fp32": lambda: torch.ops.mkl._mkl_linear(x32, mkl, w32, None, m),
        "int4_bf16": lambda: int4(xb),
        "int4_fp32": lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(
            x32, int4.packed, int4.group, int4.scale_zeros.float()
        ),
        "int8_bf16": lambda: torch.ops.aten._weight_int8pack_mm(xb, w8, s8.to(torch.bfloat16)),
        "int8_fp32": lambda: torch.ops.aten._weight_int8pack_mm(x32, w8, s8),
        "unpack_fp32": lambda: F.linear(x32, ternary.dequantize(torch.float32)),
    }
    if bf16_prepack_supported():  # oneDNN's bf16 reorder needs AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT
        onednn = torch.ops.mkldnn._reorder_linear_weight(wb, m)
        fns["prepacked_bf16"] = lambda: torch.ops.mkldnn._linear_pointwise(xb, onednn, None, "none", [], "")
    return fns


def time_us(fn, reps: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="trilm-190m")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--head", action="store_true", help="also the vocabulary projection (dense only)")
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON result")
    args = parser.parse_args(argv)
    cfg = preset(args.model)
    shapes = sorted({(cfg.hidden, cfg.hidden), (cfg.ffn, cfg.hidden), (cfg.hidden, cfg.ffn)})
    if args.head:
        shapes.append((cfg.padded_vocab, cfg.hidden))
    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for m in (int(b) for b in args.batches.split(",")):
            for n, k in shapes:
                fns = kernels_for(n, k, m)
                if n == cfg.padded_vocab:  # the head stays a float layer: only the dense products
                    fns = {name: f for name, f in fns.items() if name.startswith(("dense", "prepacked"))}
                times: dict[str, list[float]] = {name: [] for name in fns}
                for _ in range(args.rounds):
                    for name, fn in fns.items():
                        reps = max(2, args.reps // 10) if name in ("int4_fp32", "int8_fp32") else args.reps
                        times[name].append(time_us(fn, reps))
                med = {name: statistics.median(v) for name, v in times.items()}
                for name, us in med.items():
                    rows.append(
                        {
                            "threads": threads,
                            "m": m,
                            "n": n,
                            "k": k,
                            "kernel": name,
                            "us": round(us, 1),
                            "vs_dense_fp32": round(med["dense_fp32"] / us, 3),
                            "vs_dense_bf16": round(med["dense_bf16"] / us, 3),
                        }
                    )
                print(
                    f"threads {threads} M {m} {n}x{k}: "
                    + "  ".join(
                        f"{name} {us:.0f}us ({med['dense_fp32'] / us:.2f}x)" for name, us in med.items()
                    ),
                    flush=True,
                )
    if not bf16_prepack_supported():
        print(
            "prepacked_bf16 not measured: no oneDNN bf16 linear on this CPU (needs AVX-512 or AVX-NE-CONVERT)"
        )
    result = {"benchmark": "cpu_kernels", "model": args.model, "rows": rows}
    if args.out is not None:
        path = args.out / f"cpu-kernels-{args.model}-{today()}.json"
        write_result(path, result, module=__spec__.name, argv=argv)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
