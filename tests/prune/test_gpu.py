"""The same pruning run on a CUDA device (skipped without one)."""

import pytest
import torch

from trilm.store.snapshot import read_snapshot_config

from .conftest import FAST_PG, cli

pytestmark = [pytest.mark.gpu, pytest.mark.slow]  # three pruning runs: kept out of the fast GPU selection


def test_prune_on_cuda_matches_cpu_selection_and_measures_cuda_memory(tmp_path, calib_snapshot, prepared):
    common = ("--granularity", "head,channel", "--keep", ".5", "--calib", prepared["train"], *FAST_PG)
    for device in ("cpu", "cuda"):
        argv = ("--method", "wanda", *common, "--device", device, "--out", tmp_path / f"wanda-{device}")
        assert cli(calib_snapshot, *argv) == 0
    units = [
        read_snapshot_config(tmp_path / f"wanda-{d}")[1].extra["pruning"]["units"] for d in ("cpu", "cuda")
    ]
    assert units[0]["head"]["kept_indices"] == units[1]["head"]["kept_indices"]
    assert (
        cli(calib_snapshot, *common, "--device", "cuda", "--dtype", "bfloat16", "--out", tmp_path / "pg") == 0
    )
    record = read_snapshot_config(tmp_path / "pg")[1].extra["pruning"]
    assert record["device"].startswith("cuda") and record["pg"]["memory_method"].startswith("torch.cuda")
    assert record["pg"]["peak_step_bytes"] > 0
    assert torch.cuda.is_available()
