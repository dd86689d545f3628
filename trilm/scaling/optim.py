"""Batched L-BFGS: minimize many independent smooth problems at once with numpy.

Why: a Chinchilla approach-3 fit runs L-BFGS from thousands of grid starts, and a bootstrap refits the same
model on a thousand resamples. Each problem is tiny (≤ 5 parameters, a few hundred points), so a loop over
``scipy.optimize.minimize`` spends its time in Python overhead. Here every problem keeps its own L-BFGS
history and its own line search, but the objective is evaluated for all still-active problems in one
vectorised call, so the per-problem cost is a few array operations.

The line search enforces the weak Wolfe conditions by bisection and doubling (the variant Lewis and Overton
recommend for objectives that are only once differentiable, like a Huber loss): Armijo decrease with
``c1`` and curvature ``g(t)·d ≥ c2·g(0)·d``. Problems stop independently:

- ``CONVERGED_GTOL``: the largest gradient component is ≤ ``gtol``;
- ``CONVERGED_FTOL``: the decrease of one iteration is ≤ ``ftol · max(|f_old|, |f_new|, f_floor)``;
- ``MAX_ITER``: the iteration budget ran out (not converged);
- ``LINE_SEARCH_FAILED``: no step in the search satisfied Armijo decrease (not converged unless the
  gradient is already tiny: it usually means the iterate sits at the floating-point floor of the objective);
- ``NON_FINITE``: the start itself had a non-finite objective or gradient.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

CONVERGED_GTOL = 0
CONVERGED_FTOL = 1
MAX_ITER = 2
LINE_SEARCH_FAILED = 3
NON_FINITE = 4

STATUS_TEXT = {
    CONVERGED_GTOL: "converged (gradient tolerance)",
    CONVERGED_FTOL: "converged (relative objective change)",
    MAX_ITER: "iteration limit reached",
    LINE_SEARCH_FAILED: "line search found no decrease",
    NON_FINITE: "objective or gradient not finite at the start",
}

FunGrad = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
"""``fun_grad(x, idx) -> (f, g)``: objectives ``(b,)``, gradients ``(b, P)`` of problems ``idx`` at ``x``."""


@dataclasses.dataclass
class BatchResult:
    """Final iterate, objective, gradient, iteration count and status code of every problem."""

    x: np.ndarray
    fun: np.ndarray
    grad: np.ndarray
    n_iter: np.ndarray
    status: np.ndarray

    @property
    def converged(self) -> np.ndarray:
        return self.status <= CONVERGED_FTOL


def _two_loop(
    g: np.ndarray, s: np.ndarray, y: np.ndarray, rho: np.ndarray, order: list[int], gamma: np.ndarray
) -> np.ndarray:
    """Return H·g for the L-BFGS inverse-Hessian estimate of each problem.

    ``s, y`` are ``(m, b, P)`` ring buffers shared by all problems, ``order`` lists their slots newest first,
    ``rho (m, b)`` is ``1/(s·y)`` with 0 marking a slot a problem did not fill (or had reset), and ``gamma``
    scales the initial inverse Hessian per problem.
    """
    q = g.copy()
    alphas = []
    for slot in order:
        a = rho[slot] * np.einsum("bp,bp->b", s[slot], q)
        alphas.append(a)
        q -= a[:, None] * y[slot]
    r = gamma[:, None] * q
    for slot, a in zip(reversed(order), reversed(alphas)):
        beta = rho[slot] * np.einsum("bp,bp->b", y[slot], r)
        r += (a - beta)[:, None] * s[slot]
    return r


def minimize_batched(
    fun_grad: FunGrad,
    x0: np.ndarray,
    *,
    max_iter: int | np.ndarray = 2000,
    history: int = 10,
    ftol: float = 1e-13,
    gtol: float = 1e-12,
    f_floor: float = 0.0,
    c1: float = 1e-4,
    c2: float = 0.9,
    max_line_search: int = 50,
) -> BatchResult:
    """Minimize ``B`` independent problems from the starts ``x0 (B, P)``; see the module docstring.

    ``max_iter`` is one limit for all problems or one per problem. The working arrays are compacted to
    the running problems whenever half have finished, so late iterations cost what the stragglers cost.
    """
    x_out = np.array(x0, dtype=float, copy=True)
    if x_out.ndim != 2:
        raise ValueError(f"x0 must be (problems, parameters), got shape {x_out.shape}")
    n_prob, n_par = x_out.shape
    f_out, g_out = fun_grad(x_out, np.arange(n_prob))
    f_out, g_out = np.array(f_out, dtype=float), np.array(g_out, dtype=float)
    status = np.full(n_prob, -1)
    n_iter = np.zeros(n_prob, dtype=int)
    bad = ~np.isfinite(f_out) | ~np.isfinite(g_out).all(axis=1)
    status[bad] = NON_FINITE
    status[~bad & (np.abs(g_out).max(axis=1) <= gtol)] = CONVERGED_GTOL
    limit = np.broadcast_to(np.asarray(max_iter, dtype=int), (n_prob,)).copy()
    status[(status < 0) & (limit <= 0)] = MAX_ITER

    # Working set: contiguous arrays of the problems that were running at the last compaction. Finished
    # problems stay in them (masked out) until fewer than half are live, so the big history arrays are not
    # copied every iteration.
    ids = np.flatnonzero(status < 0)
    x, f, g, lim = x_out[ids], f_out[ids], g_out[ids], limit[ids]
    s_hist = np.zeros((history, ids.size, n_par))
    y_hist = np.zeros((history, ids.size, n_par))
    rho = np.zeros((history, ids.size))
    gamma = np.ones(ids.size)
    has_history: np.ndarray = np.zeros(ids.size, dtype=bool)
    live: np.ndarray = np.ones(ids.size, dtype=bool)
    order: list[int] = []
    it = 0
    while live.any():
        if live.sum() < 0.5 * live.size:
            ids, x, f, g, lim = ids[live], x[live], f[live], g[live], lim[live]
            s_hist, y_hist, rho = s_hist[:, live], y_hist[:, live], rho[:, live]
            gamma, has_history, live = gamma[live], has_history[live], live[live]
        act = np.flatnonzero(live)
        with np.errstate(all="ignore"):
            d = -_two_loop(g, s_hist, y_hist, rho, order, gamma)[act]
        xa, fa, ga = x[act], f[act], g[act]
        slope = np.einsum("bp,bp->b", ga, d)
        not_descent = ~(slope < 0) | ~np.isfinite(slope)
        if not_descent.any():
            d[not_descent] = -ga[not_descent]
            slope[not_descent] = -np.einsum("bp,bp->b", ga[not_descent], ga[not_descent])
            rho[:, act[not_descent]] = 0.0
            has_history[act[not_descent]] = False
        t = np.ones(act.size)
        first = ~has_history[act]
        t[first] = np.minimum(1.0, 1.0 / np.maximum(np.abs(ga[first]).sum(axis=1), 1e-300))

        lo = np.zeros(act.size)
        hi = np.full(act.size, np.inf)
        done: np.ndarray = np.zeros(act.size, dtype=bool)
        x_new, f_new, g_new = xa.copy(), fa.copy(), ga.copy()
        arm_x, arm_f, arm_g = xa.copy(), fa.copy(), ga.copy()
        for _ in range(max_line_search):
            srch = np.flatnonzero(~done)
            if srch.size == 0:
                break
            xt = xa[srch] + t[srch, None] * d[srch]
            ft, gt = fun_grad(xt, ids[act[srch]])
            finite = np.isfinite(ft) & np.isfinite(gt).all(axis=1)
            armijo = finite & (ft <= fa[srch] + c1 * t[srch] * slope[srch])
            curv = np.einsum("bp,bp->b", gt, d[srch]) >= c2 * slope[srch]
            ok = armijo & curv
            acc = srch[ok]
            x_new[acc], f_new[acc], g_new[acc] = xt[ok], ft[ok], gt[ok]
            done[acc] = True
            # Remember the latest Armijo point, so a search that runs out of rounds can still move.
            grow_mask = armijo & ~curv
            grow = srch[grow_mask]
            arm_x[grow], arm_f[grow], arm_g[grow] = xt[grow_mask], ft[grow_mask], gt[grow_mask]
            shrink = srch[~armijo]
            hi[shrink] = t[shrink]
            lo[grow] = t[grow]
            t[shrink] = 0.5 * (lo[shrink] + hi[shrink])
            t[grow] = np.where(np.isfinite(hi[grow]), 0.5 * (lo[grow] + hi[grow]), 2.0 * t[grow])
        moved_armijo = ~done & (lo > 0)
        x_new[moved_armijo], f_new[moved_armijo], g_new[moved_armijo] = (
            arm_x[moved_armijo],
            arm_f[moved_armijo],
            arm_g[moved_armijo],
        )
        stuck = ~done & ~moved_armijo

        it += 1
        step = x_new - xa
        dy = g_new - ga
        sy = np.einsum("bp,bp->b", step, dy)
        yy = np.einsum("bp,bp->b", dy, dy)
        upd = ~stuck & (sy > np.finfo(float).eps * yy)
        slot = (it - 1) % history
        if len(order) == history:
            order.pop()
        order.insert(0, slot)
        s_hist[slot, act], y_hist[slot, act] = step, dy
        rho[slot] = 0.0
        rho[slot, act] = np.where(upd, 1.0 / np.where(upd, sy, 1.0), 0.0)
        gamma[act] = np.where(upd, sy / np.where(upd, yy, 1.0), gamma[act])
        has_history[act] |= upd

        decrease = fa - f_new
        scale = np.maximum(np.maximum(np.abs(fa), np.abs(f_new)), f_floor)
        x[act], f[act], g[act] = x_new, f_new, g_new
        st = np.full(act.size, -1)
        st[~stuck & (decrease <= ftol * scale)] = CONVERGED_FTOL
        st[~stuck & (np.abs(g_new).max(axis=1) <= gtol)] = CONVERGED_GTOL
        # A failed search with a history retries once along the steepest descent; without one it stops.
        retry = stuck & has_history[act]
        rho[:, act[retry]] = 0.0
        has_history[act[retry]] = False
        gamma[act[retry]] = 1.0
        final = stuck & ~retry
        st[final] = np.where(np.abs(g_new[final]).max(axis=1) <= gtol, CONVERGED_GTOL, LINE_SEARCH_FAILED)
        st[(st < 0) & (it >= lim[act])] = MAX_ITER

        finished = st >= 0
        if finished.any():
            fin = act[finished]
            out = ids[fin]
            x_out[out], f_out[out], g_out[out] = x[fin], f[fin], g[fin]
            status[out], n_iter[out] = st[finished], it
            live[fin] = False
    return BatchResult(x=x_out, fun=f_out, grad=g_out, n_iter=n_iter, status=status)
