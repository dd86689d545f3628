"""The launch-plan table: occupancy, waves and bytes in flight of every default low-bit plan, without a GPU.

Usage: ``python -m benchmarks.kernels.tools.launch_table [--formats ternary binary int2 int4] [--out DIR]``

Each format's default GEMV config (batch 1) and tensor-core GEMM config (batch 16, which stands for every
batch of 2–16 rows: one 16-row block, the same config and grid) is compiled for sm_90 as the JIT would
specialize a Llama-sized layer (:mod:`benchmarks.kernels.tools.compile_check`); ptxas's registers and
the kernel's shared memory go through :mod:`trilm.kernels.launch_model` with the grid the plan would launch
at every linear shape of the nine Spectra sizes (Q/K/V and gate/up fused, as the decode step runs them) and
of SmolLM2-135M, Llama-2-7B and Llama-3-8B. Writes ``launch-plans-sm90-triton<version>.json`` and prints
the markdown table that docs/kernels.md shows; ``tests/kernels/test_launch_plans.py`` holds the plans to the
model's minimums.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import torch
from trilm.kernels.affine.plan import candidates
from trilm.kernels.launch_model import H200, Resources, launch_figures

from benchmarks.common import CHECKOUT
from trilm.formats.samples import relabelled
from trilm.model.config import SPECTRA_SIZES

FORMATS = ("ternary", "binary", "int2", "int4")
IMPORTED = {  # name: (hidden, ffn, heads, kv_heads, head_dim)
    "smollm2-135m": (576, 1536, 9, 3, 64),
    "llama-2-7b": (4096, 11008, 32, 32, 128),
    "llama-3-8b": (4096, 14336, 32, 8, 128),
}


def layer_shapes() -> list[tuple[str, int, int]]:
    """(label, N, K) of every distinct decode-step linear: fused qkv, o, fused gate/up, down."""
    models = {
        f"spectra-{s}": (h, f, heads, heads, h // heads) for s, (h, f, heads, _, _) in SPECTRA_SIZES.items()
    }
    models.update(IMPORTED)
    out = []
    for name, (hidden, ffn, heads, kv, hd) in models.items():
        out += [
            (f"{name} qkv", (heads + 2 * kv) * hd, hidden),
            (f"{name} o", hidden, heads * hd),
            (f"{name} gate_up", 2 * ffn, hidden),
            (f"{name} down", hidden, ffn),
        ]
    return out


def _tile_bytes(spec, path: str, plan) -> int:
    words_per_unit = spec.hs + (1 if spec.hs == 2 else 0)
    if path == "gemv":
        return plan.config["BLOCK_R"] * words_per_unit * plan.config["BLOCK_N"] * 4
    per = 32 // spec.wbits if spec.hs == 1 else 32
    return plan.const["BLOCK_K"] // per * words_per_unit * plan.config["BLOCK_N"] * 4


def table(formats=FORMATS) -> list[dict[str, Any]]:
    from benchmarks.kernels.tools.compile_check import compile_affine, ptxas_usage

    rows, compiled = [], {}
    for kind in formats:
        for path, m in (("gemv", 1), ("gemm", 16)):
            for label, n, k in layer_shapes():
                spec = relabelled(kind, n, k).affine
                cfg = candidates(spec, path, m)[0]
                kernel, plan = compile_affine(spec, path, cfg, torch.float16, m)
                key = (kind, path, tuple(sorted(plan.const.items())), tuple(sorted(plan.options.items())))
                if key not in compiled:
                    regs, spills = ptxas_usage(kernel, 90)
                    compiled[key] = (regs, spills, kernel.metadata.shared)
                regs, spills, shared = compiled[key]
                res = Resources(regs, shared, plan.options["num_warps"])
                grid = plan.grid[0] * plan.grid[1] * plan.grid[2]
                fig = launch_figures(
                    grid, res, _tile_bytes(spec, path, plan), plan.options["num_stages"], path=path
                )
                layer_bytes = n * k * spec.wbits * spec.hs // 8 + (n * k // 8 if spec.hs == 2 else 0)
                rows.append({
                    "format": kind, "path": path, "batch": m, "layer": label, "N": n, "K": k,
                    "layer_bytes": layer_bytes, "config": cfg, "split_k": plan.split_k,
                    "registers": regs, "spill_bytes": spills, "shared_bytes": shared,
                    "checked": layer_bytes >= H200.little_bytes_per_sm * H200.sms, **fig.row(),
                })  # fmt: skip
    return rows


def markdown(rows: list[dict[str, Any]], formats=FORMATS) -> str:
    lines = [
        f"Launch plans at sm_90 (H200: {H200.sms} SMs; Little's law at {H200.bandwidth_gbps:.0f} GB/s × "
        f"{H200.latency_us} µs = {H200.little_bytes_per_sm / 1024:.1f} KB in flight per SM), fp16 "
        "activations; largest layer of each Spectra size and imported model",
        "",
        "| format | batch | layer | N × K | config | split | regs | resident/SM | waves | warps/sched "
        "| KB in flight/SM | meets |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if not r["layer"].endswith("gate_up") or r["format"] not in formats:
            continue
        c = r["config"]
        cfg = "/".join(
            str(c.get(key, "")) for key in ("BLOCK_M", "BLOCK_R", "BLOCK_N", "BLOCK_K") if key in c
        )
        cfg += f", {c['num_warps']}w {c['num_stages']}s"
        ok = "yes" if not r["shortfalls"] else "; ".join(r["shortfalls"])
        batch = "2–16" if r["path"] == "gemm" and r["batch"] == 16 else r["batch"]
        lines.append(
            f"| {r['format']} | {batch} | {r['layer']} | {r['N']} × {r['K']} | {cfg} | {r['split_k']} "
            f"| {r['registers']} | {r['resident_per_sm']} | {r['waves']} | {r['warps_per_scheduler']} "
            f"| {r['kb_in_flight_per_sm']} | {ok} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--formats", nargs="+", default=list(FORMATS))
    p.add_argument("--out", type=Path, default=CHECKOUT / "benchmarks" / "results")
    args = p.parse_args(argv)
    import json

    import triton

    rows = table(args.formats)
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
