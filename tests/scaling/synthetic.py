"""Synthetic results tables from known laws: for tests, the benchmark and trying the tools without a suite.

Sizes follow the Spectra suite (parameters, non-embedding linear parameters and embedding + head
parameters for V = 50,304, from docs/references.md#sizes). Each run's checkpoint losses follow
``L(N, D) = E + A/N^α + B/D^β`` of its family, times log-normal noise of relative size ``noise``.
"""

from __future__ import annotations

import numpy as np

from trilm.bits import model_bits
from trilm.families import family_linear_bits
from trilm.scaling.table import ResultRow

# name: (params, non-embedding linear params, embedding + LM head params)
SPECTRA_SIZES: dict[str, tuple[float, float, float]] = {
    "99M": (99.74e6, 48.2e6, 51.5e6),
    "190M": (190.0e6, 113.2e6, 77.3e6),
    "390M": (392.4e6, 289.4e6, 103.0e6),
    "560M": (569.2e6, 440.4e6, 128.8e6),
    "830M": (834.0e6, 679.5e6, 154.5e6),
    "1.1B": (1.149e9, 968.9e6, 180.3e6),
    "1.5B": (1.515e9, 1308.6e6, 206.0e6),
    "2.4B": (2.461e9, 2229.5e6, 231.8e6),
    "3.9B": (3.989e9, 3680.5e6, 309.1e6),
}


def law_loss(law: dict[str, float], n: np.ndarray | float, d: np.ndarray | float) -> np.ndarray:
    """``E + A/N^α + B/D^β`` (a missing A or B term counts as 0)."""
    out = law["E"] + law.get("A", 0.0) / np.power(n, law.get("alpha", 1.0))
    return out + law.get("B", 0.0) / np.power(d, law.get("beta", 1.0))


def synthetic_suite(
    laws: dict[str, dict[str, float]],
    *,
    sizes: dict[str, tuple[float, float, float]] | None = None,
    tokens: float | list[float] = 300e9,
    checkpoints: int = 6,
    noise: float = 0.0,
    seed: int = 0,
    eval_name: str = "val_loss",
) -> list[ResultRow]:
    """Rows for every family × size × token budget: ``checkpoints`` log-spaced snapshots per run.

    ``tokens`` may be a list of budgets (separate runs per budget, for L(N, D)). Checkpoints run from 1/64
    of the budget to the budget; FLOPs are 6·N·D.
    """
    sizes = SPECTRA_SIZES if sizes is None else sizes
    budgets = [tokens] if isinstance(tokens, int | float) else list(tokens)
    rng = np.random.default_rng(seed)
    rows = []
    for family, law in laws.items():
        linear_bits = family_linear_bits(family)
        if linear_bits is None:
            linear_bits = 16.0
        for size, (params, linear, embed) in sizes.items():
            n_params = round(params)
            n_linear = round(linear)
            for budget in budgets:
                run = f"{family}-{size}" + (f"-{budget:.3g}" if len(budgets) > 1 else "")
                fractions = np.geomspace(1 / 64, 1.0, checkpoints) if checkpoints > 1 else np.array([1.0])
                for k, frac in enumerate(fractions):
                    d = float(budget * frac)
                    loss = float(law_loss(law, params, d) * np.exp(noise * rng.standard_normal()))
                    rows.append(
                        ResultRow(
                            run=run,
                            family=family,
                            size=size,
                            params=n_params,
                            nonembedding_params=n_params - round(embed),
                            linear_params=n_linear,
                            tokens=d,
                            flops=6.0 * params * d,
                            bits_per_param=model_bits(n_linear, n_params - n_linear, linear_bits) / n_params,
                            step=(k + 1) * 1000,
                            eval=eval_name,
                            loss=loss,
                        )
                    )
    return rows
