"""The loopback-cluster harness: multi-node runs on one machine, for the multi-node tests and the drills
(``python -m benchmarks.train.multinode``) alike. Checkout-only, like both: the wheel does not ship it.

Submodules: ``processes`` (tagged process trees, ended whatever failed), ``launchers`` (torchrun and the
DeepSpeed launcher as loopback nodes), ``sshd`` and ``slurm`` (an sshd and a real SLURM on loopback),
``drills`` (run to the end, kill a node mid-run, compare runs). Single-machine gloo runs
(``run_distributed``, ``free_port``) live in the library, :mod:`trilm.local_ranks`, for benchmarks too.
"""

from __future__ import annotations

import torch

from trilm.local_ranks import free_port, run_distributed

__all__ = ["free_port", "has_cuda", "run_distributed"]


def has_cuda() -> bool:
    return torch.cuda.is_available()
