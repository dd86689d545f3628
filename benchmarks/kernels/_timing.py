"""How :mod:`benchmarks.kernels.gpu` times a case and reports it: the two timings (flushed and CUDA graph, see
that module's docstring), the copy bandwidth of the device, and the result row built from them."""

from __future__ import annotations

import math
import time


class Timer:
    """The two timings of a case (see the module docstring), plus the copy bandwidth of this device."""

    def __init__(self, args, dev):
        import torch

        self.args, self.dev, self.torch = args, dev, torch
        self.smoke = args.cpu_smoke
        self.l2 = 0 if self.smoke else torch.cuda.get_device_properties(dev).L2_cache_size

    def copy_gbps(self) -> float | None:
        if self.smoke:
            return None
        import triton.testing as tt

        src = self.torch.empty(1 << 30, dtype=self.torch.uint8, device=self.dev)
        dst = self.torch.empty_like(src)
        ms = tt.do_bench(lambda: dst.copy_(src), warmup=10, rep=50, return_mode="median")
        return 2 * src.numel() / (ms * 1e-3) / 1e9

    def copies(self, layer_bytes: int) -> int:
        return max(2, math.ceil(self.args.l2_multiple * self.l2 / max(layer_bytes, 1)))

    def flushed(self, fn) -> float:
        if self.smoke:
            runs = []
            for _ in range(3):
                t0 = time.perf_counter()
                fn()
                runs.append((time.perf_counter() - t0) * 1e6)
            return sorted(runs)[1]
        import triton.testing as tt

        return tt.do_bench(fn, warmup=self.args.warmup_ms, rep=self.args.rep_ms, return_mode="median") * 1e3

    def graph(self, fns) -> float:
        """µs per call of ``fns`` (one per layer copy), captured in one CUDA graph and replayed."""
        if self.smoke:
            return self.flushed(lambda: [f() for f in fns]) / len(fns)
        torch = self.torch
        for f in fns:  # warm up: plans, tuning, workspaces — all outside the capture
            f()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for f in fns:
                f()
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(10):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / len(fns))
        return sorted(times)[len(times) // 2]


def case_row(label, fmt, shape, m, t_flush, t_graph, nbytes, bits, copy, fp16):
    base_flush, base_graph = fp16.get(m, (None, None))
    gbps_graph = nbytes / (t_graph * 1e-6) / 1e9
    return {
        "format": label,
        "codec": fmt,
        "shape": shape,
        "batch": m,
        "bits_per_weight": round(bits, 4),
        "bytes": nbytes,
        "us_l2_flushed": round(t_flush, 2),
        "us_cuda_graph": round(t_graph, 2),
        "gbps_flushed": round(nbytes / (t_flush * 1e-6) / 1e9, 1),
        "gbps_graph": round(gbps_graph, 1),
        "pct_copy_graph": round(100 * gbps_graph / copy, 1) if copy else None,
        "speedup_vs_fp16": round(base_flush / t_flush, 3) if base_flush else None,
        "speedup_vs_fp16_cuda_graph": round(base_graph / t_graph, 3) if base_graph else None,
    }
