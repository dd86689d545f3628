"""The launch-plan table: occupancy, waves and bytes in flight of every default low-bit plan, without a GPU.

Usage: ``python -m benchmarks.kernels.tools.launch_table [--formats ternary binary int2 int4] [--out DIR]``

Each format's default GEMV config (batch 1) and tensor-core GEMM config (batch 16, which stands for every
batch of 2–16 rows) is compiled for sm_90 and judged by :mod:`trilm.kernels.launch_model` at every linear
shape of the nine Spectra sizes (Q/K/V and gate/up fused, as the decode step runs them) and of SmolLM2-135M,
Llama-2-7B and Llama-3-8B; the table is :mod:`trilm.kernels.launch_plans`. Writes
``launch-plans-sm90-triton<version>.json`` and prints the markdown table that docs/kernels.md shows;
``tests/kernels/test_launch_plans.py`` holds the plans to the model's minimums.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from trilm.kernels.launch_model import H200
from trilm.kernels.launch_plans import FORMATS, markdown, table

from benchmarks.common import CHECKOUT
from trilm.model.config import decode_linear_shapes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--formats", nargs="+", default=list(FORMATS))
    p.add_argument("--out", type=Path, default=CHECKOUT / "benchmarks" / "results")
    args = p.parse_args(argv)
    import json

    import triton

    rows = table(args.formats, decode_linear_shapes())
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"launch-plans-sm90-triton{triton.__version__}.json"
    doc = {"triton": triton.__version__, "device_model": dataclasses.asdict(H200), "rows": rows}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(markdown(rows, args.formats))
    missed = [r for r in rows if r["checked"] and r["shortfalls"]]
    print(f"\n{len(rows)} plans, {sum(r['checked'] for r in rows)} checked (layers ≥ Little's bytes), "
          f"{len(missed)} short; wrote {path}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
