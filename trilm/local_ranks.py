"""Runs of a function on several gloo ranks in fresh processes on this machine, for tests and benchmarks.

``run_distributed(fn, world_size, *args)`` starts ``world_size`` fresh processes with the environment a
launcher would set (RANK, WORLD_SIZE, MASTER_ADDR/PORT, LOCAL_RANK), runs ``fn(*args)`` in each, tears the
process groups down whatever happens, and returns the per-rank results — or raises with every failing rank's
traceback, so a hang or a crash in one rank is reported instead of blocking the caller.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing as mp
import os
import queue as queue_module
import socket
import traceback
from collections.abc import Callable
from typing import Any

import torch

from trilm.parallel import shutdown_parallel


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _to_bytes(value: Any) -> bytes:
    """A rank's result as bytes. Tensors put on a queue as they are travel as shared-memory file descriptors,
    which the parent fetches from a listener in the rank's process: a rank that exits first (under load)
    takes the listener with it and the parent fails with FileNotFoundError."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _worker(fn, rank, world_size, port, args, env, results) -> None:
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
        }
    )
    os.environ.update(env or {})
    torch.set_num_threads(1)
    try:
        results.put((rank, True, _to_bytes(fn(*args))))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
    finally:
        with contextlib.suppress(Exception):
            shutdown_parallel()


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 300.0,
    env: dict[str, str] | None = None,
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` gloo ranks; return results ordered by rank."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_worker, args=(fn, rank, world_size, port, args, env, results), daemon=True)
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    collected: dict[int, tuple[bool, Any]] = {}
    try:
        while len(collected) < world_size:
            try:
                rank, ok, value = results.get(timeout=timeout)
            except queue_module.Empty:
                raise TimeoutError(
                    f"distributed run timed out after {timeout}s; ranks done: {sorted(collected)}"
                ) from None
            collected[rank] = (ok, value)
            if not ok:
                break
    finally:
        for p in procs:
            p.join(timeout=10 if len(collected) == world_size else 1)
            if p.is_alive():
                p.terminate()
    failures = {r: v for r, (ok, v) in collected.items() if not ok}
    if failures:
        detail = "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(failures.items()))
        raise RuntimeError(f"distributed run failed on ranks {sorted(failures)}:\n{detail}")
    return [torch.load(io.BytesIO(collected[r][1]), weights_only=False) for r in range(world_size)]
