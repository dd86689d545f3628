"""Family comparison on constructed families whose curves cross at a known size."""

from __future__ import annotations

import numpy as np
import pytest

from tests.scaling.synthetic import synthetic_suite
from trilm.scaling import analyse, write_table
from trilm.scaling.compare import crossings_theta, matched_x
from trilm.scaling.laws import get_law

# FloatLM: 2.0 + 100/N^0.3. TriLM: lower E, larger A, chosen so the curves cross at N* = 1e9 exactly.
N_STAR = 1e9
FLOAT = {"E": 2.0, "A": 100.0, "alpha": 0.3}
TRI = {"E": 1.9, "A": 100.0 + 0.1 * N_STAR**0.3, "alpha": 0.3}
SIZES = {f"s{i}": (n, 0.8 * n, 0.2 * n) for i, n in enumerate(np.geomspace(1e8, 1e10, 9))}


def _theta(p):
    return get_law("n").theta(p)


def test_crossing_of_known_curves():
    assert crossings_theta(_theta(TRI), _theta(FLOAT), 1e7, 1e12) == pytest.approx([N_STAR], rel=1e-8)
    assert crossings_theta(_theta(FLOAT), _theta(FLOAT | {"A": 200.0}), 1e7, 1e12) == []


def test_matched_size_inverts_the_reference_law():
    loss = 2.0 + 100.0 / 3e8**0.3
    assert matched_x(_theta(FLOAT), loss) == pytest.approx(3e8, rel=1e-10)
    assert matched_x(_theta(FLOAT), 1.99) == np.inf  # below FloatLM's irreducible loss
    many = matched_x(np.stack([_theta(FLOAT)] * 2), np.array([loss, 1.5]))
    assert many[0] == pytest.approx(3e8, rel=1e-10) and many[1] == np.inf


@pytest.fixture(scope="module")
def crossing_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("crossing")
    rows = synthetic_suite({"floatlm": FLOAT, "trilm": TRI}, sizes=SIZES, checkpoints=1, noise=0.0)
    table = write_table(out / "results.csv", rows)
    return analyse(table, out / "scaling", form="N", bootstrap=100, seed=0, loso=False)


def test_analysis_finds_the_known_crossover(crossing_report):
    cmp = {(c["family"], c["axis"]): c for c in crossing_report.comparisons}
    params = cmp[("trilm", "params")]
    assert len(params["crossings"]) == 1
    assert params["crossings"][0]["x"] == pytest.approx(N_STAR, rel=1e-3)
    assert params["crossings"][0]["within_data"]
    lower = [seg["lower"] for seg in params["lower_family_by_range"]]
    assert lower == ["floatlm", "trilm"]
    boot = params["bootstrap_crossing"]
    assert boot["fraction_with_crossing"] > 0.9
    lo, hi = boot["first_crossing_interval"]  # noise-free data: every resample finds N* again
    assert lo == pytest.approx(N_STAR, rel=1e-4) and hi == pytest.approx(N_STAR, rel=1e-4)


def test_matched_floatlm_size_for_each_trilm(crossing_report):
    cmp = {(c["family"], c["axis"]): c for c in crossing_report.comparisons}
    for m in cmp[("trilm", "params")]["matches"]:
        tri_loss = TRI["E"] + TRI["A"] / m["x"] ** TRI["alpha"]
        excess = tri_loss - FLOAT["E"]
        expected = (FLOAT["A"] / excess) ** (1 / FLOAT["alpha"]) if excess > 0 else np.inf
        assert m["reference_x"] == pytest.approx(expected, rel=2e-3)
        below = m["x"] < N_STAR
        assert (m["ratio"] < 1) == below  # a TriLM smaller than N* matches a smaller FloatLM
    observed = cmp[("trilm", "observed")]["shared_sizes"]
    assert [r["difference"] > 0 for r in observed] == [r["params"] < N_STAR for r in observed]


def test_bits_axis_favours_the_family_with_fewer_bits():
    # Identical losses at equal parameters: at equal size in bits the ternary family must be lower.
    law = {"E": 2.0, "A": 100.0, "alpha": 0.3}
    rows = synthetic_suite({"floatlm": law, "trilm": law}, sizes=SIZES, checkpoints=1)
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        table = write_table(Path(tmp) / "r.csv", rows)
        report = analyse(table, None, form="N", bootstrap=0, loso=False)
    cmp = {(c["family"], c["axis"]): c for c in report.comparisons}
    assert cmp[("trilm", "params")]["crossings"] == []
    bits = cmp[("trilm", "bits")]
    inside = [s for s in bits["lower_family_by_range"] if s["from"] < 1e10]
    assert inside[0]["lower"] == "trilm"
    assert all(m["ratio"] > 1 for m in bits["matches"])


def test_gap_between_families_and_its_change_with_size(tmp_path):
    """TriLM's excess over FloatLM is A_t/N^0.4 − A_f/N^0.3: it shrinks with N; the analysis says so."""
    floatlm = {"E": 2.0, "A": 100.0, "alpha": 0.3}
    trilm = {"E": 2.0, "A": 2000.0, "alpha": 0.45}
    bilm = {"E": 2.0, "A": 4000.0, "alpha": 0.45}
    rows = synthetic_suite(
        {"floatlm": floatlm, "trilm": trilm, "bilm": bilm}, sizes=SIZES, checkpoints=1, noise=0.002
    )
    report = analyse(
        write_table(tmp_path / "r.csv", rows), tmp_path / "o", form="N", bootstrap=100, loso=False
    )
    cmp = {(c["family"], c["reference"], c["axis"]): c for c in report.comparisons}
    gaps = cmp[("trilm", "floatlm", "params")]["gaps"]
    x = np.array(gaps["x"])
    truth = trilm["A"] / x ** trilm["alpha"] - floatlm["A"] / x ** floatlm["alpha"]
    assert np.allclose(gaps["gap"], truth, atol=0.01)
    assert gaps["change_interval"][1] < 0 and gaps["fraction_shrinking"] > 0.95
    assert all(a <= g <= b for g, (a, b) in zip(gaps["gap"], gaps["gap_interval"]))
    tri_vs_bi = cmp[("trilm", "bilm", "params")]["gaps"]
    assert all(g < 0 for g in tri_vs_bi["gap"])  # TriLM below BiLM at every size
    text = (tmp_path / "o" / "report.md").read_text()
    assert "Fitted gap TriLM − FloatLM" in text and "Fitted gap TriLM − BiLM" in text
