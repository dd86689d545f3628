"""L(N, D) fitted on cooldown branches, the way a suite with branches is fitted: each run's branches at early
fractions of the budget are the points, the run with its branches is one bootstrap unit (its lineage), and
the law must predict the runs' own ends and the later branches. On data drawn from the additive law it
recovers them; on data drawn from Kaplan's interacting form, whose gap between sizes grows with D, the
additive law misses and ``kaplan_e`` does not (why :mod:`trilm.scaling.select` scores laws on held-out
points)."""

from __future__ import annotations

import numpy as np
import pytest

from trilm.scaling.analyse import branch_parent, lineage
from trilm.scaling.fitter import fit
from trilm.scaling.laws import get_law
from trilm.scaling.table import ResultRow

E, A, ALPHA, B, BETA = 3.2, 400.0, 0.5, 900.0, 0.45
KAPLAN = {"E": 3.0, "N_c": 3e4, "D_c": 3e5, "alpha_N": 0.5, "alpha_D": 0.5}
BUDGET = 2_097_152
SIZES = {"32x2": 32_928, "64x2": 106_752, "96x3": 332_064, "128x4": 852_480}
FRACTIONS = (0.125, 0.25, 0.375, 0.5, 0.75, 1.0)
FIT_UP_TO = 0.5


def additive(n, d):
    return E + A / np.asarray(n, float) ** ALPHA + B / np.asarray(d, float) ** BETA


def kaplan(n, d):
    return get_law("kaplan_e").loss(KAPLAN, N=n, D=d)  # type: ignore[attr-defined]


def row(run: str, size: str, tokens: float, step: int, loss: float, **extra) -> ResultRow:
    n = SIZES[size]
    return ResultRow.from_counts(
        run=run, family="floatlm", size=size, params=n + 131_072, nonembedding_params=n, linear_params=n,
        tokens=tokens, flops=6.0 * n * tokens, step=step, eval="val_loss", loss=loss, **extra,
    )  # fmt: skip


def rows(loss, noise: float = 0.0) -> list[ResultRow]:
    """Every size's run end and its cooldown branches at :data:`FRACTIONS` of the budget."""
    rng = np.random.default_rng(0)
    out = []
    for size, n in SIZES.items():
        parent = f"floatlm-{size}"
        for at in FRACTIONS:
            d = at * BUDGET
            value = float(loss(n, d)) + noise * rng.normal()
            name, extra = (parent, {}) if at == 1.0 else (f"{parent}-cd{int(d)}", {"parent": parent})
            out.append(row(name, size, d, int(2048 * at), value, **extra))
    return out


def split(table: list[ResultRow]) -> tuple[dict, list[ResultRow]]:
    """The branches that end at ≤ ½ of the budget as a size law's data (units: lineages), and the rest."""
    points = [r for r in table if branch_parent(r) and r.tokens <= FIT_UP_TO * BUDGET + 1]
    held = [r for r in table if r not in points]
    data = {
        "N": [r.nonembedding_params for r in points],
        "D": [r.tokens for r in points],
        "loss": [r.loss for r in points],
        "unit": [lineage(r) for r in points],
    }
    return data, held


def errors(law, held: list[ResultRow]) -> np.ndarray:
    p = law.predict(N=[r.nonembedding_params for r in held], D=[r.tokens for r in held])
    return p.value - np.array([r.loss for r in held])


def test_the_fit_on_early_branches_predicts_the_held_out_ends():
    data, held = split(rows(additive))
    assert len(data["loss"]) == 16 and len(set(data["unit"])) == 4  # 4 sizes x the branches at 1/8 ... 1/2
    assert len(held) == 8  # the four runs' own ends and the four branches at 3/4
    law = fit("additive", data)
    assert law.identified, law.reasons
    assert np.max(np.abs(errors(law, held))) < 1e-3  # noiseless data of the law's own form
    assert law.predict(N=1e5, D=BUDGET).low is None  # no bootstrap asked for: no interval


def test_noisy_branches_bootstrapped_by_lineage_give_intervals_and_errors_of_the_noise_scale():
    data, held = split(rows(additive, noise=0.005))
    law = fit("additive", data, bootstrap=200, seed=0)
    assert law.bootstrap["n_units"] == 4 and law.bootstrap["n_accepted"] >= 10
    p = law.predict(N=[r.nonembedding_params for r in held], D=[r.tokens for r in held])
    assert p.low is not None and p.high is not None
    assert np.all((p.low <= p.value) & (p.value <= p.high))
    assert np.max(np.abs(errors(law, held))) < 0.05


def test_kaplans_form_predicts_the_growing_gap_that_the_additive_law_misses():
    table = rows(kaplan)
    ends = {r.nonembedding_params: r.loss for r in table if r.tokens == BUDGET}
    starts = {r.nonembedding_params: r.loss for r in table if r.tokens == FRACTIONS[0] * BUDGET}
    small, large = min(SIZES.values()), max(SIZES.values())
    assert ends[small] - ends[large] > starts[small] - starts[large]  # the gap between sizes grows with D
    data, held = split(table)
    kap = fit("kaplan_e", data)
    assert kap.params["alpha_D"] == pytest.approx(KAPLAN["alpha_D"], abs=0.02)
    assert np.max(np.abs(errors(kap, held))) < 1e-3  # noiseless data of its own form
    assert np.max(np.abs(errors(fit("additive", data), held))) > 0.03  # the additive law misses
