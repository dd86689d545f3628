"""The whole-model decode step on a GPU: bf16 FloatLM vs packed TriLM vs int4 FloatLM, one token.

Usage: ``python -m benchmarks.serve.decode [--sizes 1.1b 3.9b] [--compile-sizes 1.1b] [--out DIR]
[--dry-run]``

Each contender is a :class:`~trilm.infer.InferenceModel` of a Spectra size with random weights (packed
layers from :mod:`trilm.formats.samples`), run as a one-token forward with no KV cache (the
weights dominate: every weight is read once per token). Modes, in this order so that the cheap ones land in
the JSON first: ``eager`` (unfused), ``graph`` (one CUDA graph of the unfused step), ``fused-graph``
(Q/K/V and gate/up stacked, :func:`trilm.infer.fuse_projections`), then for ``--compile-sizes``
``compiled-graph`` (``torch.compile`` of the fused model, inductor fusing the elementwise work around the
matrix products and the ``trilm::quant_linear`` operator, captured in one CUDA graph). Time is the mean of
graph replays between CUDA events; the weights (0.28–7.8 GB) are far larger than L2, so they stream from
HBM. The JSON (device and date in name and content) is rewritten after every measurement.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from benchmarks.common import CHECKOUT, today, write_result

CONTENDERS = {  # label: (family, packed sample kind or None, activation dtype name)
    "floatlm-bf16": ("floatlm", None, "bfloat16"),
    "trilm-packed-ternary": ("trilm", "ternary", "float16"),
    "floatlm-packed-int4": ("floatlm", "int4", "float16"),
}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", default=["1.1b", "3.9b"])
    p.add_argument("--compile-sizes", nargs="*", default=["1.1b"], help="sizes also timed compiled")
    p.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=list(CONTENDERS))
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--out", type=Path, default=CHECKOUT / "benchmarks" / "results")
    p.add_argument("--dry-run", action="store_true", help="check the arguments, print the plan, run nothing")
    args = p.parse_args(argv)
    args.argv = argv
    from trilm.model.config import SPECTRA_SIZES

    for s in [*args.sizes, *args.compile_sizes]:
        if s not in SPECTRA_SIZES:
            p.error(f"unknown size {s!r}; known: {list(SPECTRA_SIZES)}")
    return args


def build_contender(size: str, label: str, dev):
    import torch
    from trilm.kernels import QuantLinear

    from trilm.formats.samples import random_packed
    from trilm.infer import InferenceModel
    from trilm.model import preset

    family, kind, dtype = CONTENDERS[label]
    model = InferenceModel(preset(f"{family}-{size}")).to(device=dev, dtype=getattr(torch, dtype)).eval()
    if kind is not None:
        for i, (name, lin) in enumerate(model.linear_modules().items()):
            packed = random_packed(kind, lin.out_features, lin.in_features, device=dev, seed=i)
            model.set_linear(name, QuantLinear(packed).to(dev))
    return model


def _graph_ms(fn, iters: int) -> float:
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _eager_ms(fn, iters: int) -> float:
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / iters


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        print(f"dry run: sizes {args.sizes} (compiled: {args.compile_sizes}), contenders {args.contenders}, "
              f"modes eager, graph, fused-graph, compiled-graph → {args.out}")  # fmt: skip
        return 0
    import torch

    if not torch.cuda.is_available():
        print("benchmarks.serve.decode needs a CUDA GPU (--dry-run checks arguments on CPU)", file=sys.stderr)
        return 2
    from trilm.infer import fuse_projections

    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    out_path = args.out / f"decode-{slug}-{today()}.json"
    report = {"device": name, "date": today(), "torch": torch.__version__, "results": {}}
    ids = torch.zeros((1, 1), dtype=torch.long, device=dev)

    def save():
        for size, rows in report["results"].items():
            base = rows.get("floatlm-bf16", {})
            for label, row in rows.items():
                for mode in ("graph", "fused-graph", "compiled-graph"):
                    if mode in row and mode in base and label != "floatlm-bf16":
                        row[f"speedup_vs_bf16_{mode}"] = round(base[mode] / row[mode], 3)
            report["results"][size] = rows
        write_result(out_path, report, module=__spec__.name, argv=args.argv)

    with torch.no_grad():
        for size in args.sizes:
            rows = report["results"].setdefault(size, {})
            for label in args.contenders:
                model = build_contender(size, label, dev)
                row = rows.setdefault(label, {})
                row["eager"] = round(_eager_ms(lambda model=model: model(ids), 10), 3)
                row["graph"] = round(_graph_ms(lambda model=model: model(ids), args.iters), 3)
                fuse_projections(model)
                row["fused-graph"] = round(_graph_ms(lambda model=model: model(ids), args.iters), 3)
                print(size, label, row, flush=True)
                save()
                del model
                torch.cuda.empty_cache()
        for size in args.compile_sizes:
            for label in args.contenders:
                model = build_contender(size, label, dev)
                fuse_projections(model)
                row = report["results"].setdefault(size, {}).setdefault(label, {})
                t0 = time.perf_counter()
                torch._dynamo.reset()
                step = torch.compile(model, fullgraph=True, dynamic=False)
                try:
                    row["compiled-graph"] = round(_graph_ms(lambda step=step: step(ids), args.iters), 3)
                except Exception as exc:  # record why, keep the other contenders
                    row["compiled-error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                row["compile_s"] = round(time.perf_counter() - t0, 1)
                print(size, label, row, flush=True)
                save()
                del model, step
                torch.cuda.empty_cache()
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
