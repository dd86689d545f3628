"""What integrity costs at load time: verified vs unverified loading of a large snapshot, side by side.

    python -m benchmarks.data.store                       # floatlm-1.1b (4.4 GB fp32), under runs/store-bench
    python -m benchmarks.data.store --preset trilm-3.9b   # needs ~2× the snapshot in free memory

Writes a snapshot of the preset with random weights through the store's one writer (``COMPLETE`` with the
size and CRC-32 of every file), then loads its weights repeatedly, alternating:

- **verified** (the default): ``open_model(path).weights.float_state()`` — the CRC-32 of every file the
  manifest lists, then the tensors, each checked to be finite;
- **unverified**: ``open_model(path, verify=False)`` — the same without the CRC pass;
- a whole model load, verified and unverified: ``trilm.infer.load_inference_model`` on the opened directory
  (what ``trilm eval``, ``generate`` and ``serve`` do);
- and their parts alone: the CRC pass, the finiteness check, and safetensors' plain ``load_file`` with every
  tensor materialised (``load_file`` maps the file lazily; a loader copies the bytes out in any case).

The file is in the page cache for every measured load (it was just written and is read once before
timing): what is measured is the extra work, not the disk. On a cold cache the CRC pass reads the file
from disk first and the load then finds it cached, so the extra cost is at most one more read. Each load
is timed in wall seconds and in this process's CPU seconds; on a shared machine the CPU time is the steady
figure, and the ratio is taken per repeat (verified and unverified run back to back). Results go to
``benchmarks/results/store.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import RESULTS, write_result
from trilm.model.config import preset
from trilm.model.flops import parameter_counts
from trilm.model.snapshot import SnapshotMeta
from trilm.model.spec import canonical_shapes
from trilm.store.integrity import check_listed, read_complete
from trilm.store.layout import WEIGHTS_FILE
from trilm.store.open import open_model
from trilm.store.snapshot import read_snapshot_config, write_snapshot
from trilm.store.tensors import check_finite


def build(path: Path, name: str) -> tuple[float, int]:
    """Write the snapshot (reused when a complete one of this config is there); (seconds, bytes)."""
    cfg = preset(name)
    if (path / "COMPLETE").is_file() and read_snapshot_config(path)[0] == cfg:
        return float("nan"), (path / WEIGHTS_FILE).stat().st_size
    if path.exists():
        raise SystemExit(f"{path}: exists and is not a complete {name} snapshot; remove it or pass --dir")
    gen = torch.Generator().manual_seed(0)
    state = {}
    for key, shape in canonical_shapes(cfg).items():
        state[key] = (
            torch.ones(shape) if key.endswith("norm.weight") else torch.randn(shape, generator=gen) * 0.02
        )
    counts = parameter_counts(cfg)
    meta = SnapshotMeta(step=0, family=cfg.family, size=cfg.size_name, params=counts.total)
    start = time.perf_counter()
    write_snapshot(path, cfg, meta, state)
    seconds = time.perf_counter() - start
    return seconds, (path / WEIGHTS_FILE).stat().st_size


def timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process): on a shared machine the CPU time is the steadier one."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    del result
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="floatlm-1.1b")
    parser.add_argument("--dir", type=Path, default=Path("runs/store-bench"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=RESULTS / "store.json")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()[0]
    path = args.dir / args.preset
    write_s, size = build(path, args.preset)
    complete = read_complete(path)
    open_model(path, verify=False).weights.float_state()  # warm the page cache once, untimed

    from safetensors.torch import load_file

    def finite_only():
        state = load_file(str(path / WEIGHTS_FILE))
        for tensor in state.values():  # touch the mapped pages first: time the check, not the reading
            tensor.view(-1)[:: 1 << 14].sum()
        return timed(lambda: [check_finite(path / WEIGHTS_FILE, k, t) for k, t in state.items()])

    def materialise():
        return {k: v.clone() for k, v in load_file(str(path / WEIGHTS_FILE)).items()}

    def model_load(verify: bool):
        from trilm.infer import load_inference_model

        return load_inference_model(open_model(path, verify=verify))

    keys = ("model_verified", "model_unverified", "verified", "unverified", "crc", "finite", "load_file")
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in keys}
    for _ in range(args.repeats):
        runs["model_verified"].append(timed(lambda: model_load(True)))
        runs["model_unverified"].append(timed(lambda: model_load(False)))
        runs["verified"].append(timed(lambda: open_model(path).weights.float_state()))
        runs["unverified"].append(timed(lambda: open_model(path, verify=False).weights.float_state()))
        runs["crc"].append(timed(lambda: check_listed(complete)))
        runs["finite"].append(finite_only())
        runs["load_file"].append(timed(materialise))
    wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
    paired = [v[1] / u[1] for v, u in zip(runs["verified"], runs["unverified"], strict=True)]
    extra = [v[1] - u[1] for v, u in zip(runs["verified"], runs["unverified"], strict=True)]
    gib = size / 2**30
    print(f"{args.preset}: {size:,} bytes ({gib:.2f} GiB), median of {args.repeats}")
    if write_s == write_s:
        print(f"  written (with its manifest) in {write_s:.1f} s")
    print(f"  {'load':<28} {'wall s':>8} {'CPU s':>8} {'GiB/CPU s':>10}")
    labels = {
        "model_verified": "InferenceModel, verified",
        "model_unverified": "InferenceModel, unverified",
        "verified": "verified (default)",
        "unverified": "unverified (verify=False)",
        "crc": "  CRC-32 pass alone",
        "finite": "  finiteness check alone",
        "load_file": "  load_file + materialise",
    }
    for key, label in labels.items():
        print(f"  {label:<28} {wall[key]:>8.2f} {cpu[key]:>8.2f} {gib / cpu[key]:>10.2f}")
    ratio = statistics.median(paired)
    model_paired = [
        v[0] / u[0] for v, u in zip(runs["model_verified"], runs["model_unverified"], strict=True)
    ]
    print(
        f"  verified / unverified, CPU time, paired by repeat: {ratio:.2f}× (median; "
        f"{min(paired):.2f}–{max(paired):.2f}), +{statistics.median(extra):.2f} CPU s"
    )
    print(
        f"  a whole model load (trilm.infer.load_inference_model), verified / unverified, wall time: "
        f"{statistics.median(model_paired):.2f}× ({min(model_paired):.2f}–{max(model_paired):.2f})"
    )
    print(f"  (load average {load_start:.1f} → {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    result = {
        "preset": args.preset,
        "bytes": size,
        "repeats": args.repeats,
        "page_cache": "warm",
        "write_seconds": None if write_s != write_s else round(write_s, 3),
        "wall_seconds": {k: [round(w, 3) for w, _ in v] for k, v in runs.items()},
        "cpu_seconds": {k: [round(c, 3) for _, c in v] for k, v in runs.items()},
        "median_wall_seconds": {k: round(v, 3) for k, v in wall.items()},
        "median_cpu_seconds": {k: round(v, 3) for k, v in cpu.items()},
        "verified_over_unverified_cpu": {
            "median": round(ratio, 3),
            "per_repeat": [round(x, 3) for x in paired],
            "extra_cpu_seconds_median": round(statistics.median(extra), 3),
        },
        "model_load_verified_over_unverified_wall": {
            "median": round(statistics.median(model_paired), 3),
            "per_repeat": [round(x, 3) for x in model_paired],
        },
        "load_average_1m_at_start_and_end": [round(load_start, 2), round(os.getloadavg()[0], 2)],
    }
    write_result(args.json, result, module=__spec__.name, argv=argv)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
