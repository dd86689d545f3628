"""Benchmark: trilm's batched approach-3 fitter vs a plain scipy multi-start, on Epoch's Chinchilla data.

Launch::

    python -m benchmarks.scaling                    # full 4,500-start grid for every method (a few minutes)
    python -m benchmarks.scaling --starts 450       # a random tenth of the grid, same for every method
    python -m benchmarks.scaling --csv PATH --json out.json

Both methods minimize the same objective (Huber δ = 1e-3 on log-loss residuals, summed, log-sum-exp
parametrization) from the same starts and keep the best:

- ``scipy-numgrad``: ``scipy.optimize.minimize(method="L-BFGS-B")`` per start, gradients by finite differences
  (what a plain implementation does);
- ``scipy-analytic``: the same loop with a hand-written analytic gradient (separates the gain of the
  gradient from the gain of batching);
- ``trilm``: :func:`trilm.scaling.fitter.fit` of the law ``additive``, every start in one batched L-BFGS.

All run single-threaded (one BLAS thread). Then it times bootstraps: 1,000 resamples of the Chinchilla
fit (and Epoch's 4,000), and 1,000 resamples of the 3-parameter law ``n`` on 9 sizes. A bootstrap is
timed as a fit started at the full-data optimum (one start, which converges at once) with its refits.
"""

from __future__ import annotations

# ruff: noqa: E402 - the thread variables must be set before numpy and scipy load BLAS
import os

# One BLAS thread for everyone: scipy's L-BFGS-B calls BLAS on tiny matrices, where OpenBLAS's extra thread
# only spins (it doubled scipy's CPU time without shortening its wall time).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import cpu_model, write_result
from trilm.scaling.chinchilla import EPOCH_ESTIMATES, default_csv_path, load_chinchilla
from trilm.scaling.fitter import HUBER_DELTA, Fit, fit
from trilm.scaling.laws import get_law


def scipy_multistart(log_n, log_d, log_l, starts, analytic: bool):
    """Loop over starts with scipy's L-BFGS-B; theta order [ln A, α, ln B, β, ln E] as trilm's law
    ``additive``."""
    try:
        from scipy.optimize import minimize
    except ImportError as exc:  # the baseline only: trilm's own fit needs no scipy
        raise SystemExit("benchmarks.scaling compares against scipy: pip install '.[bench]'") from exc

    def objective(theta):
        # The same objective as trilm's, as one vectorized numpy expression per call (cheaper per call than
        # scipy.special.logsumexp/huber, so the baseline is not handicapped).
        a, alpha, b, beta, e = theta
        u1 = a - alpha * log_n
        u2 = b - beta * log_d
        top = np.maximum(np.maximum(u1, u2), e)
        r = top + np.log(np.exp(u1 - top) + np.exp(u2 - top) + np.exp(e - top)) - log_l
        c = np.clip(r, -HUBER_DELTA, HUBER_DELTA)
        return float(np.sum(c * (r - 0.5 * c)))

    def fun_grad(theta):
        # The same expression plus its analytic gradient, per start (as a hand-written scipy fit would).
        a, alpha, b, beta, e = theta
        u1 = a - alpha * log_n
        u2 = b - beta * log_d
        top = np.maximum(np.maximum(u1, u2), e)
        p1, p2, p3 = np.exp(u1 - top), np.exp(u2 - top), np.exp(e - top)
        total = p1 + p2 + p3
        r = top + np.log(total) - log_l
        c = np.clip(r, -HUBER_DELTA, HUBER_DELTA)
        w = c / total
        g1, g2 = w * p1, w * p2
        grad = np.array([g1.sum(), -(g1 @ log_n), g2.sum(), -(g2 @ log_d), (w * p3).sum()])
        return float(np.sum(c * (r - 0.5 * c))), grad

    best = None
    n_fail = 0
    for x0 in starts:
        if not analytic:
            res = minimize(objective, x0, method="L-BFGS-B")
        else:
            res = minimize(fun_grad, x0, jac=True, method="L-BFGS-B")
        n_fail += not res.success
        if best is None or res.fun < best.fun:
            best = res
    return best, n_fail


class Clock:
    """Wall and process CPU seconds since construction."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def lap(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


def params_of(theta):
    return get_law("additive").natural(np.asarray(theta))


def bootstrap(result: Fit, data: dict, n_resamples: int, seed: int) -> Fit:
    """``result``'s bootstrap alone: a fit from its own optimum (one start) with ``n_resamples`` refits."""
    return fit(result.law, data, starts=result.theta[None], bootstrap=n_resamples, seed=seed)


def se(boot: Fit) -> dict[str, float]:
    return {k: float(np.std(v, ddof=1)) for k, v in boot.boot_params().items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", type=Path, default=None, help="Epoch's chinchilla_svg_extracted_data.csv")
    parser.add_argument(
        "--starts", type=int, default=0, help="a seeded random subset of this many grid starts"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args(argv)

    data = load_chinchilla(args.csv or default_csv_path())
    law = get_law("additive")
    starts = law.grid()
    if 0 < args.starts < len(starts):
        starts = starts[np.sort(np.random.default_rng(0).permutation(len(starts))[: args.starts])]
    points = {"N": data.N, "D": data.D, "loss": data.loss}
    log_x, log_y = law.design(points), np.log(data.loss)
    print(
        f"Chinchilla (Epoch): {data.loss.size} points; {len(starts)} grid starts; {os.cpu_count()} CPUs;"
        f" numpy {np.__version__}; {cpu_model()}"
    )

    # Wall and CPU seconds: on a shared machine the CPU time of this process is the steadier measure.
    rows: dict[str, tuple[Any, ...]] = {}
    clock = Clock()
    full = fit(law, points, starts=starts)
    rows["trilm"] = (*clock.lap(), full.objective, full.params, full.n_starts - full.n_starts_converged)
    for name, analytic in (("scipy-analytic", True), ("scipy-numgrad", False)):
        clock = Clock()
        best, n_fail = scipy_multistart(log_x[0], log_x[1], log_y, starts, analytic)
        rows[name] = (*clock.lap(), float(best.fun), params_of(best.x), n_fail)

    print(
        f"\n{'method':<15}{'wall s':>8}{'CPU s':>8}{'objective':>16}  {'E':>7} {'A':>7} {'B':>8}"
        f" {'alpha':>7} {'beta':>7}  not converged"
    )
    for name, (wall, cpu, obj, p, n_fail) in rows.items():
        print(
            f"{name:<15}{wall:>8.2f}{cpu:>8.2f}{obj:>16.10g}  {p['E']:>7.4f} {p['A']:>7.1f} {p['B']:>8.1f}"
            f" {p['alpha']:>7.4f} {p['beta']:>7.4f}  {n_fail}"
        )
    e = EPOCH_ESTIMATES
    print(
        f"{'Epoch AI':<15}{'':>8}{'':>8}{'':>16}  {e['E']:>7.4f} {e['A']:>7.1f} {e['B']:>8.1f}"
        f" {e['alpha']:>7.4f} {e['beta']:>7.4f}"
    )
    ratios = {
        f"{base}_{kind}": rows[base][i] / rows["trilm"][i]
        for base in ("scipy-numgrad", "scipy-analytic")
        for i, kind in ((0, "wall"), (1, "cpu"))
    }
    print()
    for base, what in (("scipy-numgrad", "numerical gradients"), ("scipy-analytic", "an analytic gradient")):
        print(
            f"speed-up of trilm over scipy with {what}: {ratios[base + '_cpu']:.1f}x CPU time,"
            f" {ratios[base + '_wall']:.1f}x wall time"
        )

    boots = {}
    for n_res in (1000, 4000):
        clock = Clock()
        boot = bootstrap(full, points, n_res, seed=42)
        boots[f"chinchilla_ND_{n_res}"] = (*clock.lap(), boot)
    n9 = np.geomspace(1e8, 4e9, 9)
    rng = np.random.default_rng(0)
    nine = {"N": n9, "loss": (1.8 + 400 / n9**0.3) * np.exp(0.005 * rng.standard_normal(9))}
    fit9 = fit("n", nine)
    clock = Clock()
    boot9 = bootstrap(fit9, nine, 1000, seed=0)
    boots["L(N)_9_sizes_1000"] = (*clock.lap(), boot9)
    print()
    for name, (sec, cpu, boot) in boots.items():
        b = boot.bootstrap
        detail = ", ".join(f"SE {k} {v:.4g}" for k, v in se(boot).items() if k in ("E", "alpha", "beta"))
        print(
            f"bootstrap {name}: {sec:.2f} s wall, {cpu:.2f} s CPU for {b['n_resamples']} resamples"
            f" ({b['n_accepted']} accepted, {b['n_degenerate']} degenerate, {b['n_not_converged']} not"
            f" converged); {detail}"
        )

    if args.json:
        out = {
            "n_points": int(data.loss.size),
            "n_starts": len(starts),
            "fits": {
                k: {"wall_s": v[0], "cpu_s": v[1], "objective": v[2], "params": v[3], "not_converged": v[4]}
                for k, v in rows.items()
            },
            "speedup": ratios,
            "bootstrap": {k: {"wall_s": v[0], "cpu_s": v[1]} for k, v in boots.items()},
        }
        write_result(args.json, out, module=__spec__.name, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
