"""Chinchilla's approach 1 on cooled-down points: the lowest loss reachable at each compute C, and which model
size reaches it.

Chinchilla takes, at each FLOP count, the lowest loss over the training curves of all sizes (each run's
cosine cycle matched to its length). With a warmup-stable-decay schedule the valid points are the cooled
ones: every cooldown branch's and every run's final checkpoint (a checkpoint mid-run is at the peak rate
and sits above what a run of that length would reach). Per size those points form a curve of loss against
training FLOPs (``trilm.model.flops``, through the results table's ``flops`` column); the envelope at C is
the lowest of the curves that cover C, interpolated linearly in log C (no curve is extended beyond its own
points). Where at least two sizes cover C the winner is a choice the data make, and N*(C), D*(C) are read
off there; N*(C) = k·C^a is fitted by least squares in log-log when at least three distinct sizes win
somewhere, with a bootstrap over sizes. With fewer the exponent is *not identified* and the envelope is
shown without a law.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import numpy as np

from trilm.scaling.fitter import percentile_interval

MIN_WINNERS = 3
GRID = 80


@dataclasses.dataclass
class Envelope:
    family: str
    flops: np.ndarray
    loss: np.ndarray
    n_opt: np.ndarray
    d_opt: np.ndarray
    size_opt: list[str]
    contested: np.ndarray
    """Grid points where at least two sizes' curves cover C (the winner is a choice the data make)."""
    exponent_n: float | None = None
    exponent_d: float | None = None
    interval_n: tuple[float, float] | None = None
    reason: str = ""
    """Why the exponents are not identified (empty when they are)."""

    @property
    def identified(self) -> bool:
        return self.exponent_n is not None and not self.reason

    def winners(self) -> list[str]:
        return list(dict.fromkeys(s for s, c in zip(self.size_opt, self.contested) if c))

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "flops": self.flops.tolist(),
            "loss": self.loss.tolist(),
            "n_opt": self.n_opt.tolist(),
            "d_opt": self.d_opt.tolist(),
            "size_opt": self.size_opt,
            "contested": self.contested.tolist(),
            "winners": self.winners(),
            "exponent_n": self.exponent_n,
            "exponent_d": self.exponent_d,
            "interval_n": list(self.interval_n) if self.interval_n else None,
            "identified": self.identified,
            "not_identified_because": self.reason,
        }


def size_curves(points: list[dict[str, Any]]) -> dict[str, dict[str, np.ndarray]]:
    """Per size, its cooled points sorted by compute: ``{size: {"flops", "loss", "n", "tokens"}}``."""
    by_size: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in points:
        by_size[p["size"]].append(p)
    out = {}
    for size, items in by_size.items():
        items = sorted(items, key=lambda p: p["flops"])
        out[size] = {
            "flops": np.array([p["flops"] for p in items], float),
            "loss": np.array([p["loss"] for p in items], float),
            "n": np.array([p["n"] for p in items], float),
            "tokens": np.array([p["tokens"] for p in items], float),
        }
    return out


def _envelope_of(curves: dict[str, dict[str, np.ndarray]], grid: np.ndarray):
    sizes = list(curves)
    loss = np.full((len(sizes), grid.size), np.inf)
    lg = np.log(grid)
    for i, s in enumerate(sizes):
        c = curves[s]
        if c["flops"].size < 2:
            continue
        lc = np.log(c["flops"])
        inside = (lg >= lc[0] - 1e-12) & (lg <= lc[-1] + 1e-12)
        loss[i, inside] = np.interp(lg[inside], lc, c["loss"])
    best = np.argmin(loss, axis=0)
    covered = np.isfinite(loss).sum(axis=0)
    return sizes, loss, best, covered


def _power(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def envelope(
    family: str, points: list[dict[str, Any]], *, bootstrap: int = 0, seed: int = 0, level: float = 0.95
) -> Envelope | None:
    """The approach-1 envelope of one family's cooled points (``{"size", "n", "tokens", "flops", "loss"}``);
    None when fewer than two sizes have a curve (two points or more)."""
    curves = {s: c for s, c in size_curves(points).items() if c["flops"].size >= 2}
    if len(curves) < 2:
        return None
    lo = min(c["flops"][0] for c in curves.values())
    hi = max(c["flops"][-1] for c in curves.values())
    grid = np.geomspace(lo, hi, GRID)
    sizes, loss, best, covered = _envelope_of(curves, grid)
    n_of = {s: float(curves[s]["n"][0]) for s in sizes}
    fpt = {s: float(np.median(curves[s]["flops"] / curves[s]["tokens"])) for s in sizes}
    size_opt = [sizes[b] for b in best]
    env = Envelope(
        family=family,
        flops=grid,
        loss=loss[best, np.arange(grid.size)],
        n_opt=np.array([n_of[s] for s in size_opt]),
        d_opt=grid / np.array([fpt[s] for s in size_opt]),
        size_opt=size_opt,
        contested=covered >= 2,
    )
    winners = env.winners()
    if len(winners) < MIN_WINNERS:
        env.reason = (
            f"only {len(winners)} size(s) ({', '.join(winners) or 'none'}) are compute-optimal anywhere"
            f" the curves overlap; N*(C) needs at least {MIN_WINNERS}"
        )
        return env
    mask = env.contested
    env.exponent_n = _power(grid[mask], env.n_opt[mask])
    env.exponent_d = _power(grid[mask], env.d_opt[mask])
    if bootstrap:
        rng = np.random.default_rng(seed)
        names = list(curves)
        values: list[float] = []
        for _ in range(bootstrap):
            pick = rng.integers(0, len(names), len(names))
            sub = {names[i]: curves[names[i]] for i in set(pick.tolist())}
            if len(sub) < MIN_WINNERS:
                continue
            s2, _, b2, cov2 = _envelope_of(sub, grid)
            m2 = cov2 >= 2
            won = {s2[b] for b, c in zip(b2, m2) if c}
            if len(won) < MIN_WINNERS:
                continue
            n2 = np.array([n_of[s2[b]] for b in b2])
            values.append(_power(grid[m2], n2[m2]))
        if values:
            lo, hi = percentile_interval(values, level)
            env.interval_n = (float(lo), float(hi))
    return env


def gaps(env: Envelope, ref: Envelope, count: int = 3) -> list[tuple[float, float]]:
    """``(C, loss − reference loss)`` at ``count`` compute values spread (in log C) over the range both
    envelopes cover: the families compared at equal training FLOPs. Empty when the ranges do not overlap."""
    lo, hi = max(env.flops[0], ref.flops[0]), min(env.flops[-1], ref.flops[-1])
    if not lo < hi:
        return []
    at = np.geomspace(lo, hi, count)
    mine = np.interp(np.log(at), np.log(env.flops), env.loss)
    theirs = np.interp(np.log(at), np.log(ref.flops), ref.loss)
    return [(float(c), float(a - b)) for c, a, b in zip(at, mine, theirs)]
