"""The launch-plan table: occupancy, waves and bytes in flight of every default low-bit plan, without a GPU.

Each format's default GEMV config (batch 1) and tensor-core GEMM config (batch 16, which stands for every
batch of 2–16 rows: one 16-row block, the same config and grid) is compiled for sm_90 as the JIT would
specialize a Llama-sized layer (:mod:`trilm.kernels.aot`); ptxas's registers and the kernel's shared memory
go through :mod:`trilm.kernels.launch_model` with the grid the plan would launch at each layer shape given
(the decode step's linears of the nine Spectra sizes and the imported Llama models:
:func:`trilm.model.config.decode_linear_shapes`). ``tests/kernels/test_launch_plans.py`` holds the plans to
the model's minimums; ``python -m benchmarks.kernels.tools.launch_table`` writes the table
(``launch-plans-sm90-triton<version>.json``) and prints the markdown that docs/kernels.md shows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from trilm.kernels.affine.plan import candidates
from trilm.kernels.aot import compile_affine, ptxas_usage
from trilm.kernels.launch_model import H200, Resources, launch_figures

from trilm.formats.samples import relabelled

FORMATS = ("ternary", "binary", "int2", "int4")
"""The low-bit formats with affine kernels whose plans the table covers by default."""


def _tile_bytes(spec, path: str, plan) -> int:
    """Bytes of packed words one program loads per tile (the code planes, and the mask of 2-plane codes)."""
    words_per_unit = spec.hs + (1 if spec.hs == 2 else 0)
    if path == "gemv":
        return plan.config["BLOCK_R"] * words_per_unit * plan.config["BLOCK_N"] * 4
    per = 32 // spec.wbits if spec.hs == 1 else 32
    return plan.const["BLOCK_K"] // per * words_per_unit * plan.config["BLOCK_N"] * 4


def table(formats: Iterable[str], shapes: Sequence[tuple[str, int, int]]) -> list[dict[str, Any]]:
    """One row per (format, path, layer): the default plan at ``shapes`` ((label, N, K), e.g.
    :func:`trilm.model.config.decode_linear_shapes`), its config, ptxas's registers and spills, and the
    launch-model figures; ``checked`` marks the layers holding at least Little's bytes, which must meet
    them."""
    rows, compiled = [], {}
    for kind in formats:
        for path, m in (("gemv", 1), ("gemm", 16)):
            for label, n, k in shapes:
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


def markdown(rows: list[dict[str, Any]], formats: Iterable[str] = FORMATS) -> str:
    """The table docs/kernels.md shows: the gate/up rows (each size's largest layer) of ``formats``."""
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
