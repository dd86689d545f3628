"""``trilm suite plan``: the arithmetic of one row against a count by hand, totals, and the printed table."""

from __future__ import annotations

import pytest

from trilm.cli import main
from trilm.suite import load_suite
from trilm.suite.plan import plan_suite


def test_trilm_99m_row_by_hand():
    plan = plan_suite(load_suite("spectra"))
    cost = next(c for c in plan.costs if c.run.name == "trilm-99m")
    # embedding + head 2·50,304·512; 16 layers of q,k,v,o (4·512²) and SwiGLU (3·512·1,280); 33 RMSNorm gains
    embedding = 50_304 * 512
    linear = 16 * (4 * 512 * 512 + 3 * 512 * 1280)
    assert linear == 48_234_496
    assert cost.params == 2 * embedding + linear + 33 * 512 == 99_762_688
    # training FLOPs/token: 3 × (2 × (block linears + LM head) + 4·layers·heads·head_dim·seq)
    assert cost.flops_per_token == 3 * (2 * (linear + embedding) + 4 * 16 * 8 * 64 * 2048) == 645_267_456
    # 300B tokens in whole batches of 512 × 2,048 tokens
    assert cost.steps == 286_102 and cost.tokens == 286_102 * 1_048_576 == 299_999_690_752
    assert cost.flops == pytest.approx(645_267_456 * 299_999_690_752, rel=1e-12)
    # H100 989 TFLOP/s at MFU 0.4; TP 1 × DP 8
    assert cost.device_hours == pytest.approx(cost.flops / (989e12 * 0.4) / 3600, rel=1e-12)
    assert cost.device_hours == pytest.approx(135.93, abs=0.01)
    assert cost.run.devices == 8 and cost.wall_hours == pytest.approx(cost.device_hours / 8)
    # snapshots: every 2,000 steps from 0 (144), 1, 2, 4, …, 512 (10) and the last step; 2 states kept
    assert cost.snapshots == 144 + 10 + 1 and cost.states_kept == 2
    # bf16 on GPU: snapshot 2 bytes/param, state 2 + 12 bytes/param
    assert cost.disk_bytes == (155 * 2 + 2 * 14) * 99_762_688


def test_floatlm_3_9b_row_and_totals():
    plan = plan_suite(load_suite("spectra"))
    cost = next(c for c in plan.costs if c.run.name == "floatlm-3.9b")
    assert cost.steps == 300_000_000_000 // 2_097_152 == 143_051
    assert cost.snapshots == 72 + 10 + 1  # 0, 2,000, …, 142,000; the log-spaced steps; the last
    assert cost.run.devices == 48 and cost.run.nodes == 6
    assert plan.total_flops == pytest.approx(sum(c.flops for c in plan.costs))
    assert plan.total_device_hours == pytest.approx(sum(c.device_hours for c in plan.costs))
    assert plan.total_disk == sum(c.disk_bytes for c in plan.costs)
    assert any("TP 6 does not divide 8 devices per node" in n for n in plan.notes())


def test_plan_command_prints_the_spectra_table(capsys):
    assert main(["suite", "plan", "spectra"]) == 0
    out = capsys.readouterr().out
    assert "priced on H100 at 989 TFLOP/s peak × MFU 0.4" in out
    rows = [line for line in out.splitlines() if line.startswith(("trilm-", "floatlm-"))]
    assert len(rows) == 18
    assert rows[0].split()[:5] == ["trilm-99m", "99.8M", "1.94e+20", "300B", "286,102"]
    assert "total (18 runs)" in out
    assert main(["suite", "plan", "spectra", "--device", "V100", "--mfu", "0.5"]) == 0
    assert "V100 at 125 TFLOP/s peak × MFU 0.5" in capsys.readouterr().out
