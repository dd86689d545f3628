"""RTN with and without calibration passes, side by side: the same QuantLM layers, measured in one run.

RTN reads no data, so ``trilm quantize --method rtn`` takes no ``--calib``: calibration would tokenize and
sample the windows and run the block engine's passes (embed the windows, run every block over them) only to
throw them away. This script times both paths on the post-hoc benchmark model's architecture
(``configs/train/posthoc-floatlm.yaml``: hidden 256, 6 blocks, context 256) with random weights — RTN's cost
does not depend on the weight values — and checks that they write the same layers::

    python -m benchmarks.posthoc.rtn --calib runs/quickstart/data/train [--samples 128] [--repeats 3]

``--calib`` is any source ``trilm quantize`` reads (a prepared split of a 2,048-token vocabulary here). The
"with calibration" path is what a calibrated method runs first:
:func:`~trilm.posthoc.calibration.load_calibration` (128 windows of min(2048, context) tokens, the CLI's
defaults), then the engine with those windows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import CHECKOUT, write_result

CONFIG = CHECKOUT / "configs" / "train" / "posthoc-floatlm.yaml"


def model_config():
    """The post-hoc FloatLM's architecture (its training config's ``model`` section)."""
    from trilm.train.config import TrainConfig

    return TrainConfig.from_yaml(CONFIG).model


def quantize(cfg, state, windows, bits: int, group: int):
    """(seconds, packed layers) of RTN over a fresh model; ``windows`` None runs it data-free."""
    from trilm.infer import from_state_dict
    from trilm.posthoc.engine import EngineConfig, quantize_blockwise
    from trilm.posthoc.layerwise import LayerwiseMethod
    from trilm.posthoc.uniform import UniformConfig

    model = from_state_dict(cfg, state).requires_grad_(False)
    method = LayerwiseMethod("rtn", UniformConfig(bits=bits, group_size=group))
    start = time.perf_counter()
    report = quantize_blockwise(model, windows, method, EngineConfig(progress=False))
    return time.perf_counter() - start, {k: r.packed for k, r in report.layers.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calib", required=True, help="calibration source for the 'with calibration' path")
    parser.add_argument("--samples", type=int, default=128, help="calibration windows (trilm quantize: 128)")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each path (the median is reported)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="also write the timings here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from trilm.model import build_model
    from trilm.posthoc.calibration import CalibrationConfig, load_calibration

    cfg = model_config()
    state = build_model(cfg, tp=1, seed=0).full_state_dict()
    params = sum(t.numel() for t in state.values())
    seq = min(2048, cfg.context)
    calib_cfg = CalibrationConfig(source=str(args.calib), samples=args.samples, seq_len=seq)

    with_calib, load, data_free = [], [], []
    reference = None
    for _ in range(args.repeats):
        start = time.perf_counter()
        windows = load_calibration(calib_cfg).windows
        load.append(time.perf_counter() - start)
        seconds, packed = quantize(cfg, state, windows, args.bits, args.group_size)
        with_calib.append(load[-1] + seconds)
        seconds, alone = quantize(cfg, state, None, args.bits, args.group_size)
        data_free.append(seconds)
        same = packed.keys() == alone.keys() and all(
            torch.equal(packed[k].dequantize(), alone[k].dequantize()) for k in packed
        )
        if not same:
            print("the two paths wrote different layers", file=sys.stderr)
            return 1
        reference = alone
    before, after = statistics.median(with_calib), statistics.median(data_free)
    print(
        f"RTN W{args.bits} g{args.group_size} on {cfg.name} ({params / 1e6:.2f}M parameters, "
        f"{len(reference)} linears), {args.threads} thread(s), median of {args.repeats}:"
    )
    print(
        f"  with calibration ({args.samples} x {seq} tokens): {before:.2f} s "
        f"(reading the windows {statistics.median(load):.2f} s)"
    )
    print(f"  data-free:                           {after:.2f} s")
    print(f"  {before / after:.1f}x faster; identical packed layers")
    if args.json:
        result = {
            "model": cfg.name,
            "parameters": params,
            "bits": args.bits,
            "group_size": args.group_size,
            "windows": [args.samples, seq],
            "with_calibration_s": with_calib,
            "reading_windows_s": load,
            "data_free_s": data_free,
            "median_speedup": before / after,
            "identical_layers": True,
        }
        write_result(args.json, result, module=__spec__.name, argv=argv)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
