"""What every benchmark shares: one description of the machine it ran on, and one result writer.

Each benchmark runs from the repository root as ``python -m benchmarks.NAME [ARGS]``. A result file says
where its numbers came from in the same three keys whatever the script: ``device`` (:func:`machine`, one
set of keys everywhere: CPU model and instruction set torch dispatches to, core count, torch threads, load
average, GPU if any), ``date`` (UTC, ISO 8601) and ``command`` (how to run it again). Files are written
through a temporary file and a rename, so a benchmark interrupted while saving leaves the previous result
whole.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

CHECKOUT = Path(__file__).resolve().parents[1]
"""The repository the benchmarks run in (its configs, its results folder)."""

RESULTS = CHECKOUT / "benchmarks" / "results"


def cpu_model() -> str:
    """The CPU's marketing name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(**extra: Any) -> dict[str, Any]:
    """The machine a benchmark ran on, with the same keys in every result file; ``extra`` adds notes."""
    try:
        import torch
    except ImportError:  # a benchmark without torch still describes its CPU
        torch = None
    gpu = None
    if torch is not None and torch.cuda.is_available():
        gpu = {
            "name": torch.cuda.get_device_name(0),
            "count": torch.cuda.device_count(),
            "cuda": torch.version.cuda,
        }
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return {
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability() if torch is not None else None,
        "cpus": os.cpu_count(),
        "cpus_usable": len(affinity) if affinity is not None else os.cpu_count(),
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "torch": torch.__version__ if torch is not None else None,
        "gpu": gpu,
        **extra,
    }


def today() -> str:
    """The UTC date, the stamp in result file names."""
    return datetime.datetime.now(datetime.UTC).date().isoformat()


def command(module: str, argv: list[str] | None = None) -> str:
    """The command line that reruns a benchmark (``argv`` None: this process's arguments)."""
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python", "-m", module, *args])


def write_result(
    path: str | Path, result: dict[str, Any], *, module: str, argv: list[str] | None = None, indent: int = 1
) -> Path:
    """Write ``result`` as JSON at ``path`` with ``device``, ``date`` and ``command`` first.

    Keys already in ``result`` win (a file updated in place keeps the day it was first written), so the
    three provenance keys are filled only when absent. The parent folder is created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "command": command(module, argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": machine(),
        **result,
    }
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=indent, default=str) + "\n")
    os.replace(tmp, path)
    return path
