"""The default GEMV plans put enough work in flight on every SM of an H200, judged by the launch-plan model
(:mod:`trilm.kernels.launch_model`, tabled by :mod:`trilm.kernels.launch_plans`) over the kernels compiled
here for sm_90, at every decode-step layer shape of the nine Spectra sizes and the Llama shapes trilm
imports that is large enough for bandwidth to matter (at least Little's-law bytes); so do the default
tensor-core GEMM plans of batches 2–16 (one 16-row block: the batch-16 plan is the plan of every one of
them), whose tile is chosen by the same model."""

import json
from pathlib import Path

import pytest
import triton
from trilm.kernels.launch_model import H200, Resources, launch_figures
from trilm.kernels.launch_plans import table

from trilm.model.config import decode_linear_shapes

COMMITTED = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_model_reproduces_the_profiled_starvation_of_the_old_plan():
    """A starved plan as an H200 profile showed it (8 × 16 programs of 4 warps, one stage, 165 registers):
    under a wave, about one warp per scheduler, nothing loading while a tile decodes."""
    old = launch_figures(8 * 16, Resources(165, 4, 4), tile_bytes=8 * 1024 * 4, stages=1)
    assert old.waves < 1 and old.warps_per_scheduler < 1.1
    assert any("num_stages 1" in s for s in old.shortfalls())
    assert any("warps per scheduler" in s for s in old.shortfalls())


def test_issue_floor_counts_warp_instructions_over_every_scheduler():
    """One warp instruction per scheduler and cycle: 32 threads' worth of weights per instruction slot."""
    per_second = H200.sms * H200.schedulers * H200.clock_ghz * 1e9
    assert H200.issue_floor_us(8192 * 8192, 6.0) == pytest.approx(8192 * 8192 * 6.0 / 32 / per_second * 1e6)
    assert 11 < H200.issue_floor_us(8192 * 8192, 6.0) < 13


def test_little_minimum_is_stated_per_sm():
    assert H200.little_bytes_per_sm == pytest.approx(4250e9 * 0.7e-6 / 132)
    assert 20 * 1024 < H200.little_bytes_per_sm < 25 * 1024


@pytest.mark.slow
def test_default_gemv_and_decode_gemm_plans_meet_the_minimums(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    rows = table(("ternary", "int4"), decode_linear_shapes())
    checked = [r for r in rows if r["checked"]]
    assert len([r for r in checked if r["path"] == "gemv"]) >= 30
    assert len([r for r in checked if r["path"] == "gemm"]) >= 30
    short = [(r["format"], r["layer"], r["shortfalls"]) for r in checked if r["shortfalls"]]
    assert not short, short
    assert all(r["spill_bytes"] == 0 for r in rows)
    committed = COMMITTED / f"launch-plans-sm90-triton{triton.__version__}.json"
    if committed.exists():  # the committed table is what this code compiles to
        by_key = {(r["format"], r["path"], r["layer"]): r for r in json.loads(committed.read_text())["rows"]}
        for r in rows:
            old = by_key[(r["format"], r["path"], r["layer"])]
            assert (old["config"], old["split_k"], old["registers"]) == (
                r["config"],
                r["split_k"],
                r["registers"],
            )
