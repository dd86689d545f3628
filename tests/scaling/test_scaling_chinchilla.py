"""Regression test of the fitter on Epoch AI's digitized Chinchilla data (the numbers and their source:
docs/references.md#scaling-law-fitting).

The CSV ships with trilm (``trilm/scaling/data/``, its README has the source and licence status).
"""

from __future__ import annotations

import hashlib

import pytest

from trilm.scaling.chinchilla import (
    EPOCH_ESTIMATES,
    EPOCH_STANDARD_ERRORS,
    default_csv_path,
    load_chinchilla,
    render_comparison,
    reproduce,
)
from trilm.scaling.fitter import fit

CSV = default_csv_path()
CSV_SHA256 = "193478df4e90f040016431996c45682659306840ecdadf83cfb9cd5ca0aa1b30"


@pytest.fixture(scope="module")
def chinchilla_fit():
    data = load_chinchilla(CSV)
    return data, fit("additive", {"N": data.N, "D": data.D, "loss": data.loss})


def test_the_shipped_csv_is_epochs_file():
    assert hashlib.sha256(CSV.read_bytes()).hexdigest() == CSV_SHA256


def test_loader_drops_the_five_highest_losses():
    data = load_chinchilla(CSV)
    assert data.loss.size == 240 and data.dropped_loss.size == 5
    assert data.dropped_loss.min() >= data.loss.max()
    assert ((data.D * 6 * data.N) / data.flops).round(12).tolist() == [1.0] * 240


def test_fit_reproduces_epoch_estimates_within_their_standard_errors(chinchilla_fit):
    """Golden numbers from a float64 fit: at a converged minimum, summation-order noise of ~1e-16 in the
    objective moves the parameters by ~1e-8 relative, far inside the tolerances (which are the precision
    Epoch's estimates are quoted at)."""
    _, fit = chinchilla_fit
    assert fit.status.startswith("converged") and fit.n_starts == 4500 and fit.n_points == 240
    for name, estimate in EPOCH_ESTIMATES.items():
        assert abs(fit.params[name] - estimate) < EPOCH_STANDARD_ERRORS[name], name
    # Epoch's exact replication on Hoffmann's grid (docs/references.md#scaling-law-fitting): A 477.8,
    # B 2143.9, E 1.817, α 0.3473, β 0.3672.
    assert fit.params["A"] == pytest.approx(477.8, rel=2e-3)
    assert fit.params["B"] == pytest.approx(2143.9, rel=2e-3)
    assert fit.params["E"] == pytest.approx(1.817, abs=1e-3)
    assert fit.params["alpha"] == pytest.approx(0.3473, abs=2e-4)
    assert fit.params["beta"] == pytest.approx(0.3672, abs=2e-4)


def test_bootstrap_standard_errors_match_epoch():
    result = reproduce(CSV, None, n_resamples=500, seed=42)
    boot = result["fit"]["bootstrap"]
    assert boot["n_accepted"] == 500 and boot["n_not_converged"] == 0 and boot["n_degenerate"] == 0
    for name in ("E", "alpha", "beta", "A"):
        se = result["comparison"][name]["ours_se"]
        assert se == pytest.approx(EPOCH_STANDARD_ERRORS[name], rel=0.25), name
    for name, estimate in EPOCH_ESTIMATES.items():
        lo, hi = result["comparison"][name]["ours_interval"]
        assert lo < estimate < hi, name


def test_reproduce_writes_the_comparison(tmp_path, chinchilla_fit):
    result = reproduce(CSV, tmp_path, n_resamples=0, fit=chinchilla_fit[1])
    assert all(abs(r["z_vs_epoch"]) < 1 for r in result["comparison"].values())
    text = (tmp_path / "report.md").read_text()
    assert "| alpha | 0.3473 |" in text and text == render_comparison(result)
    assert (tmp_path / "loss_nd.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "loss_nd.svg").stat().st_size > 1000


def test_missing_csv_is_a_clear_error(tmp_path):
    from trilm.scaling.table import TableError

    with pytest.raises(TableError, match="is not there; pass its path"):
        load_chinchilla(tmp_path / "absent.csv")
