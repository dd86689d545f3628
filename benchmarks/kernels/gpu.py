"""Low-bit kernel benchmark on one GPU: per format, layer shape and batch — µs, GB/s, % of the copy bandwidth
measured in the same run and speedup over fp16 ``F.linear``, plus a whole-model single-token forward.

    python -m benchmarks.kernels                 # every format × 2 shapes × batch 1/16, + model (~4 min)
    python -m benchmarks.kernels --formats ternary int4 --shapes 8192x8192 --batches 1 --no-model
    python -m benchmarks.kernels --crossover     # GEMM vs dequantize + cuBLAS over M; stores the crossover

Two timings per case, both streaming weights from HBM: **flushed** — ``triton.testing.do_bench`` (256 MB
L2 flush before every run, normal launch: host overhead included) — and **graph** — one CUDA graph that
runs the same product over enough distinct copies of the layer to exceed the L2 several times, replayed;
µs per layer = replay time / copies (launch overhead removed, weights not L2-resident). Bytes per call =
stored weight bytes (codes + scales + metadata) + fp16 activations in + outputs out; GB/s = bytes / time;
"% copy" compares with a device-to-device copy of 1 GiB timed in the same run. Each layer is checked against
its dequantized weight first. Results go to ``benchmarks/results/kernels-<device>-<date>.json`` after every
case. Whole model: FloatLM-1.1B bf16 vs TriLM-1.1B packed ternary vs FloatLM-1.1B packed int4 (random
weights; ``trilm.infer.InferenceModel``), one token, eager and CUDA graph. gemlite is an optional baseline.
The timings and the row they make are :mod:`benchmarks.kernels._timing`.

What the CPU can say about the kernels is in ``tools/``: SASS instructions per weight
(``python -m benchmarks.kernels.tools.instructions``) and storage bits per weight
(``python -m benchmarks.kernels.tools.bits_table``). ``--instructions`` and ``--bits-table`` here run those
commands, as aliases for one release.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from benchmarks.common import CHECKOUT, today, write_result
from benchmarks.kernels._timing import Timer, case_row

SHAPES = ["8192x8192", "4096x11008"]
BATCHES = [1, 16]
FORMATS = ["ternary", "binary", "nm2:4", "billm", "int2", "int3", "int4", "pbllm"]
TARGETS = {  # issue 11, H200, 8192 × 8192 from HBM: (format, batch, × fp16, % of copy bandwidth)
    "ternary GEMV ≥4x fp16 and ≥60% of copy bandwidth": ("ternary", 1, 4.0, 60.0),
    "binary GEMV ≥6x fp16": ("binary", 1, 6.0, None),
    "int4 g128 GEMV ≥3x fp16": ("int4", 1, 3.0, None),
    "int2 GEMV ≥4.5x fp16": ("int2", 1, 4.5, None),
    "ternary batch 16 ≥2x fp16": ("ternary", 16, 2.0, None),
}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--formats", nargs="+", default=FORMATS, help=f"sample kinds (default {FORMATS})")
    p.add_argument("--shapes", nargs="+", default=SHAPES, help="KxN shapes (in x out)")
    p.add_argument("--batches", nargs="+", type=int, default=BATCHES)
    p.add_argument(
        "--spectra-shapes",
        nargs="*",
        metavar="SIZE",
        help="also every decode-step layer shape (fused qkv, o, fused gate/up, down) of these Spectra sizes "
        "(default when given bare: 1.1b 3.9b)",
    )
    p.add_argument(
        "--compare-gemv",
        nargs="+",
        type=int,
        default=[],
        metavar="M",
        help="also these batches (2–8), on the first shape only, each on the default tensor-core GEMM and "
        "on the CUDA-core GEMV (rows with path 'gemv'): the data behind TC_MIN_M",
    )
    p.add_argument(
        "--compare-pairs",
        action="store_true",
        help="batch 1, first shape: also the tuned GEMV plan and the first pair candidate, decoding fp16 "
        "pairs (rows with path 'gemv-pairs')",
    )
    p.add_argument("--dry-run", action="store_true", help="check the arguments, print the cases, run nothing")
    p.add_argument("--model", action="store_true", default=True, help="whole-model single-token forward")
    p.add_argument("--no-model", dest="model", action="store_false")
    p.add_argument("--model-size", default="1.1b")
    p.add_argument("--gemlite", action="store_true", help="also time gemlite int4 (`pip install gemlite`)")
    p.add_argument(
        "--crossover", action="store_true", help="time GEMM vs dequantize+cuBLAS over M and store it"
    )
    p.add_argument("--warmup-ms", type=int, default=10)
    p.add_argument("--rep-ms", type=int, default=40)
    p.add_argument("--l2-multiple", type=float, default=4.0, help="graph mode: layer copies ≥ this × L2")
    p.add_argument("--out", type=Path, default=CHECKOUT / "benchmarks" / "results")
    p.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="check this script on CPU (tiny shape, wall-clock timing, fp32; set TRITON_INTERPRET=1 to run "
        "the kernels in the interpreter); numbers are meaningless",
    )
    p.add_argument(
        "--instructions",
        action="store_true",
        help="alias of python -m benchmarks.kernels.tools.instructions (for one release)",
    )
    p.add_argument(
        "--bits-table",
        metavar="KxN",
        help="alias of python -m benchmarks.kernels.tools.bits_table KxN (for one release)",
    )
    args = p.parse_args(argv)
    args.argv = argv
    if args.cpu_smoke:
        args.shapes, args.batches, args.gemlite, args.model = ["256x192"], [1, 16], False, False
    if args.spectra_shapes is not None:
        from trilm.model.config import decode_linear_shapes

        sizes = args.spectra_shapes or ["1.1b", "3.9b"]
        known = {label.split()[0].removeprefix("spectra-") for label, _, _ in decode_linear_shapes()}
        if unknown := sorted(set(sizes) - known):
            p.error(f"--spectra-shapes: unknown size(s) {unknown}; known: {sorted(known)}")
        extra = [f"{k}x{n}" for label, n, k in decode_linear_shapes() if label.split()[0][8:] in sizes]
        args.shapes = list(dict.fromkeys([*args.shapes, *extra]))
    for s in args.shapes:
        if not re.fullmatch(r"\d+x\d+", s):
            p.error(f"--shapes: {s!r} is not KxN")
    if bad := [m for m in args.compare_gemv if not 2 <= m <= 8]:
        p.error(f"--compare-gemv: batches must be 2–8 (the GEMV's rows), got {bad}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        model = args.model_size if args.model else "off"
        print(f"dry run: formats {args.formats}, batches {args.batches}, {len(args.shapes)} shapes "
              f"{args.shapes}, GEMV vs GEMM at {args.compare_gemv or 'no batch'}, fp16 pairs "
              f"{'on' if args.compare_pairs else 'off'}, whole model {model} "
              f"→ {args.out}")  # fmt: skip
        return 0
    # deferred for start-up time: the CPU tools compile kernels (triton) that --dry-run never needs
    from benchmarks.kernels.tools import bits_table, instructions

    if args.bits_table:
        return bits_table.main([args.bits_table])
    if args.instructions:
        return instructions.main(["--out", str(args.out)])
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available() and not args.cpu_smoke:
        print("benchmarks.kernels needs a CUDA GPU; none found (--cpu-smoke, --instructions run on CPU).",
              file=sys.stderr)  # fmt: skip
        return 2
    import triton
    from tqdm import tqdm
    from trilm.kernels import QuantLinear

    from trilm.formats.samples import random_packed

    dev = torch.device("cpu" if args.cpu_smoke else "cuda")
    name = "cpu-smoke" if args.cpu_smoke else torch.cuda.get_device_name(dev)
    act_dtype = torch.float32 if args.cpu_smoke else torch.float16
    timer = Timer(args, dev)
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    out_path = args.out / f"kernels-{slug}-{today()}.json"
    copy = timer.copy_gbps()
    report = {
        "kernel_device": name,
        "copy_gbps": round(copy, 1) if copy else None,
        "l2_bytes": timer.l2,
        "triton": triton.__version__,
        "settings": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k not in ("argv", "out")
        },
        "results": [],
    }

    def save():
        write_result(out_path, report, module=__spec__.name, argv=args.argv)

    if args.crossover:
        report["crossover"] = _crossover(args, dev, timer)
        save()
        print(json.dumps(report["crossover"], indent=1))
        return 0
    start = time.time()
    bar = tqdm(
        total=len(args.shapes) * (len(args.formats) + 1 + int(args.gemlite)), desc="kernels", unit="fmt"
    )
    for shape in args.shapes:
        k, n = (int(v) for v in shape.split("x"))
        compare = args.compare_gemv if shape == args.shapes[0] else []
        batches = list(dict.fromkeys([*args.batches, *compare]))
        xs = {m: torch.randn(m, k, device=dev, dtype=act_dtype) for m in batches}
        fp16 = {}
        w_bytes = n * k * 2
        weights = [
            (torch.randn(n, k, device=dev) / k**0.5).to(act_dtype) for _ in range(timer.copies(w_bytes))
        ]
        for m, x in xs.items():
            t_flush = timer.flushed(lambda x=x, w=weights[0]: F.linear(x, w))
            t_graph = timer.graph([lambda x=x, w=w: F.linear(x, w) for w in weights])
            fp16[m] = (t_flush, t_graph)
            nbytes = w_bytes + x.numel() * 2 + m * n * 2
            report["results"].append(
                case_row("fp16", "F.linear", shape, m, t_flush, t_graph, nbytes, 16.0, copy, fp16)
            )
        del weights
        save()
        bar.update(1)
        for kind in args.formats:
            first = random_packed(kind, n, k, device=dev, seed=1)
            w_bytes = first.storage_bits() // 8
            layers = [QuantLinear(random_packed(kind, n, k, device=dev, seed=1 + i) if i else first)
                      for i in range(timer.copies(w_bytes))]  # fmt: skip
            wdq = first.dequantize(torch.float32)
            for m, x in xs.items():
                y = layers[0](x)  # builds the plan (and tunes it once on a GPU)
                ref = F.linear(x.float(), wdq)
                err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
                t_flush = timer.flushed(lambda x=x, layer=layers[0]: layer(x))
                t_graph = timer.graph([lambda x=x, layer=layer: layer(x) for layer in layers])
                nbytes = w_bytes + x.numel() * 2 + m * n * 2
                row = case_row(
                    kind,
                    first.FORMAT,
                    shape,
                    m,
                    t_flush,
                    t_graph,
                    nbytes,
                    first.bits_per_weight(),
                    copy,
                    fp16,
                )
                plan = layers[0]._plans.get((m, x.dtype, x.device))
                config = None if plan is None else {**plan.config, "SPLIT_K": plan.split_k}
                path = None if plan is None else plan.path
                row.update(max_rel_err=err, copies=len(layers), config=config, path=path)
                report["results"].append(row)
                if m in compare and path == "gemm":
                    report["results"].append(
                        _gemv_row(row, layers, x, wdq, timer, nbytes, first.bits_per_weight(), copy, fp16)
                    )
                if m == 1 and args.compare_pairs and shape == args.shapes[0] and x.dtype == torch.float16:
                    bits = first.bits_per_weight()
                    report["results"].extend(
                        _pair_rows(row, plan, layers, x, wdq, timer, nbytes, bits, copy, fp16)
                    )
                save()
            del layers, first, wdq
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            bar.update(1)
        if args.gemlite:
            report["results"].extend(_gemlite_rows(shape, k, n, xs, timer, copy, fp16))
            save()
            bar.update(1)
    bar.close()
    if args.model:
        report["model"] = _whole_model(args, dev, timer)
        save()
    report["elapsed_s"] = round(time.time() - start, 1)
    report["targets"] = _targets(report["results"], report.get("model"))
    save()
    _print_table(report)
    print(f"\nwrote {out_path} ({report['elapsed_s']} s)")
    return 0


def _gemv_row(gemm_row, layers, x, wdq, timer, nbytes, bits, copy, fp16, config=None, label="gemv") -> dict:
    """The same product on the CUDA-core GEMV (the default at batch 1), for the row of the tensor-core GEMM
    that serves this batch by default; with ``config``, on that GEMV plan (``--compare-pairs``)."""
    import torch.nn.functional as F
    from trilm.kernels.affine.plan import make_plan

    m = x.shape[0]
    plans = [make_plan(layer._kernel_cache.affine, "gemv", m, x.dtype, config) for layer in layers]
    y, ref = plans[0](x), F.linear(x.float(), wdq)
    t_flush = timer.flushed(lambda: plans[0](x))
    t_graph = timer.graph([lambda plan=plan: plan(x) for plan in plans])
    row = case_row(gemm_row["format"], gemm_row["codec"], gemm_row["shape"], m, t_flush, t_graph, nbytes,
                   bits, copy, fp16)  # fmt: skip
    row.update(
        max_rel_err=((y.float() - ref).abs().max() / ref.abs().max()).item(),
        copies=len(plans),
        config={**plans[0].config, "SPLIT_K": plans[0].split_k},
        path=label,
    )
    return row


def _pair_rows(row, plan, layers, x, wdq, timer, nbytes, bits, copy, fp16) -> list[dict]:
    """Batch 1 on the fp16-pair GEMV (two codes per packed instruction, a tuning candidate not yet timed
    anywhere): the tuned plan with ``"PAIRS": True`` and the first pair candidate, beside the tuned plan's
    row (a tuning cache seeded from an earlier run would never time them; two rows per format keep the GPU
    suite's kernel stage inside its budget)."""
    from trilm.kernels.affine.tuning import GEMV_CANDIDATES

    if plan is None or plan.path != "gemv" or plan.spec.hs != 1 or plan.config.get("PAIRS"):
        return []
    first_pair = next(c for c in GEMV_CANDIDATES[1] if c.get("PAIRS"))
    configs = [{**plan.config, "PAIRS": True}, *([first_pair] if first_pair != plan.config else [])]
    timed = (row, layers, x, wdq, timer, nbytes, bits, copy, fp16)
    return [_gemv_row(*timed, config=cfg, label="gemv-pairs") for cfg in configs]


def _whole_model(args, dev, timer) -> dict:
    """The contenders of :mod:`benchmarks.serve.decode`, one-token forward, eager and graph (ms), timed like
    the kernels above (``python -m benchmarks.serve.decode`` adds the fused and compiled steps and other
    sizes)."""
    import torch

    from benchmarks.serve.decode import CONTENDERS, build_contender

    out = {"size": args.model_size}
    ids = torch.zeros((1, 1), dtype=torch.long, device=dev)
    for label in CONTENDERS:
        model = build_contender(args.model_size, label, dev)
        with torch.no_grad():
            model(ids)  # plans (and their one-time tuning) before anything is timed
            eager_ms = timer.flushed(lambda model=model: model(ids)) / 1e3
            graph_ms = timer.graph([lambda model=model: model(ids)]) / 1e3
        out[label] = {"eager_ms": round(eager_ms, 3), "graph_ms": round(graph_ms, 3)}
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    base = out["floatlm-bf16"]["graph_ms"]
    out["trilm_speedup_graph"] = round(base / out["trilm-packed-ternary"]["graph_ms"], 3)
    return out


def _crossover(args, dev, timer) -> dict:
    """Smallest M (of a doubling sweep) where dequantize + cuBLAS beats the fused GEMM, per format; stored in
    the kernel tuning cache under ``crossover|<device>|<format>|N|K``."""
    import torch
    from trilm.kernels.affine.plan import affine_matmul, make_plan
    from trilm.kernels.affine.tuning import shared_cache
    from trilm.kernels.dispatch import prepare

    from trilm.formats.samples import random_packed

    cache, out = shared_cache(), {}
    for kind in ("ternary", "int4"):
        for shape in args.shapes:
            k, n = (int(v) for v in shape.split("x"))
            spec = prepare(random_packed(kind, n, k, device=dev)).affine
            sweep, found = {}, None
            for m in (32, 64, 128, 256, 512, 1024, 2048):
                x = torch.randn(m, k, device=dev, dtype=torch.float16)
                plan = make_plan(spec, "gemm", m, x.dtype)
                fused = timer.flushed(lambda x=x, plan=plan: plan(x))
                cublas = timer.flushed(lambda x=x, spec=spec: affine_matmul(x, spec, path="cublas"))
                sweep[m] = {"gemm_us": round(fused, 2), "cublas_us": round(cublas, 2)}
                if found is None and cublas < fused:
                    found = m
            key = f"crossover|{torch.cuda.get_device_name(dev)}|{kind}|N{n}|K{k}"
            cache.put(key, {"CUBLAS_MIN_M": found})
            out[key] = {"crossover_m": found, "sweep": sweep}
    cache.save()
    return out


def _targets(rows, model):
    out = {}
    for label, (fmt, batch, speedup, pct) in TARGETS.items():
        row = next((r for r in rows if r.get("format") == fmt and r.get("shape") == "8192x8192"
                    and r.get("batch") == batch), None)  # fmt: skip
        if row is None:
            out[label] = "not measured"
            continue
        x = row["speedup_vs_fp16_cuda_graph"] or 0
        ok = x >= speedup and (pct is None or (row["pct_copy_graph"] or 0) >= pct)
        out[label] = {"met": ok, "speedup_graph": x, "pct_copy_graph": row["pct_copy_graph"]}
    if model:
        x = model["trilm_speedup_graph"]
        out["packed TriLM single-token forward, graph ≥3x bf16 FloatLM"] = {"met": x >= 3.0, "speedup": x}
    return out


def _gemlite_rows(shape, k, n, xs, timer, copy, fp16):
    """gemlite A16W4 (HQQ-style int4, group 128) as an external baseline, imported only here; any failure is
    recorded as a skipped row instead of stopping the run."""
    try:
        import gemlite
        import torch
        from gemlite.helper import A16W4_HQQ_INT

        w_q = torch.randint(0, 16, (n, k), dtype=torch.uint8, device="cuda")
        scales = torch.rand(n, k // 128, dtype=torch.float16, device="cuda") / 64
        zeros = torch.full((n, k // 128), 8.0, dtype=torch.float16, device="cuda")
        layer = A16W4_HQQ_INT(device="cuda").from_weights(w_q, scales, zeros)
        rows = []
        for m, x in xs.items():
            t_flush = timer.flushed(lambda x=x: layer(x))
            t_graph = timer.graph([lambda x=x: layer(x)])  # one copy: L2-resident, unlike the other rows
            nbytes = k * n // 2 + k * n // 128 * 4 + x.numel() * 2 + m * n * 2
            version = getattr(gemlite, "__version__", "?")
            rows.append(
                case_row(
                    "gemlite-int4", f"gemlite {version}", shape, m, t_flush, t_graph, nbytes, 4.25, copy, fp16
                )
            )
        return rows
    except Exception as exc:
        return [{"format": "gemlite-int4", "shape": shape, "skipped": f"{type(exc).__name__}: {exc}"}]


def _print_table(report):
    import torch

    r0, torch_version = report, torch.__version__
    print(
        f"\n{r0['kernel_device']}  copy {r0['copy_gbps']} GB/s  torch {torch_version}  triton {r0['triton']}"
    )
    cols = ("format", "shape", "M", "bits", "µs", "µs graph", "GB/s graph", "%copy", "x fp16", "x graph")
    widths = (14, 11, 3, 6, 8, 9, 10, 6, 7, 8)
    print(" ".join(f"{c:>{w}s}" if i else f"{c:{w}s}" for i, (c, w) in enumerate(zip(cols, widths))))
    for r in report["results"]:
        if "skipped" in r:
            print(f"{r['format']:14s} {r['shape']:>11s} skipped: {r['skipped']}")
            continue
        values = (
            f"{r['format'] + ('/gemv' if r.get('path') == 'gemv' else ''):14s}",
            f"{r['shape']:>11s}",
            f"{r['batch']:3d}",
            f"{r['bits_per_weight']:6.3f}",
            f"{r['us_l2_flushed']:8.2f}",
            f"{r['us_cuda_graph']:9.2f}",
            f"{r['gbps_graph']:10.0f}",
            f"{r['pct_copy_graph'] or 0:6.1f}",
            f"{r['speedup_vs_fp16'] or 0:7.2f}",
            f"{r['speedup_vs_fp16_cuda_graph'] or 0:8.2f}",
        )
        print(" ".join(values))
    if report.get("model"):
        print("\nwhole model:", json.dumps(report["model"]))
    print("\ntargets:")
    for label, value in report["targets"].items():
        print(f"  {label}: {value}")


if __name__ == "__main__":
    sys.exit(main())
