"""The Chinchilla data digitized by Epoch AI, and Epoch's estimates: the fitter's regression test.

Epoch AI ("Chinchilla Scaling: A replication attempt", Besiroglu et al. 2024) extracted 245 (model size,
training FLOP, loss) points from Fig. 4 of Hoffmann et al. (2022), dropped the 5 highest-loss points and
fitted approach 3 to the remaining 240 with D = FLOP / (6 N). trilm's refit is the law ``additive`` through
:func:`trilm.scaling.fitter.fit`, the fitter every scaling tool uses. Their CSV ships with trilm as package
data (``trilm/scaling/data/``, whose README records its source, checksum and licence status).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path

import numpy as np

from trilm.atomic import write_text
from trilm.scaling import fitter
from trilm.scaling.fitter import Fit
from trilm.scaling.report_types import FittedPoints
from trilm.scaling.table import TableError

CSV_NAME = "chinchilla_svg_extracted_data.csv"

# Epoch AI's estimates and standard errors (their Table 1): the targets of the reproduction.
EPOCH_ESTIMATES = {"E": 1.817, "A": 482.01, "B": 2085.43, "alpha": 0.3478, "beta": 0.3659}
EPOCH_STANDARD_ERRORS = {"E": 0.0257, "A": 124.52, "B": 1293.28, "alpha": 0.0154, "beta": 0.0206}
# Hoffmann et al.'s published approach-3 fit, for comparison.
HOFFMANN_ESTIMATES = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}


def default_csv_path() -> Path:
    """The copy of Epoch's CSV that ships with trilm (``trilm/scaling/data/``)."""
    return Path(__file__).resolve().parent / "data" / CSV_NAME


@dataclasses.dataclass
class ChinchillaData:
    """Model sizes N, training tokens D = FLOP / 6N, FLOP and final losses, plus the dropped points."""

    N: np.ndarray
    D: np.ndarray
    flops: np.ndarray
    loss: np.ndarray
    dropped_loss: np.ndarray


def load_chinchilla(path: str | Path | None = None, *, drop_highest: int = 5) -> ChinchillaData:
    """Read Epoch's CSV (columns ``Model Size``, ``Training FLOP``, ``loss``) and drop the highest losses."""
    path = Path(path) if path is not None else default_csv_path()
    if not path.is_file():
        raise TableError(f"{path}: the Chinchilla data (Epoch AI's {CSV_NAME}) is not there; pass its path")
    n, c, loss = _read_rows(path)
    if len(loss) <= drop_highest:
        raise TableError(
            f"{path}: {len(loss)} rows, but {drop_highest} are dropped (the highest losses): nothing to fit"
        )
    order = np.argsort(loss, kind="stable")
    keep, drop = order[: len(order) - drop_highest], order[len(order) - drop_highest :]
    N, C, L = np.array(n), np.array(c), np.array(loss)
    return ChinchillaData(
        N=N[keep], D=C[keep] / (6 * N[keep]), flops=C[keep], loss=L[keep], dropped_loss=L[drop]
    )


def _read_rows(path: Path) -> tuple[list[float], list[float], list[float]]:
    """(N, C, loss) of every row; any damage (bytes that are not UTF-8, a NUL, a field beyond csv's limit, a
    value that is not a positive finite number) is a TableError naming the file and, where known, the line."""
    n: list[float] = []
    c: list[float] = []
    loss: list[float] = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TableError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        for column in ("Model Size", "Training FLOP", "loss"):
            if column not in (reader.fieldnames or []):
                raise TableError(f"{path}: missing column {column!r}")
        for record in reader:
            where = f"{path} line {reader.line_num}"
            try:
                values = [float(record[k]) for k in ("Model Size", "Training FLOP", "loss")]
            except (TypeError, ValueError):
                raise TableError(f"{where}: a value is not a number") from None
            if not all(np.isfinite(values)) or min(values) <= 0:
                raise TableError(f"{where}: values must be positive and finite, got {values}")
            n.append(values[0])
            c.append(values[1])
            loss.append(values[2])
    except csv.Error as exc:
        raise TableError(f"{path} line {reader.line_num}: not a readable CSV row ({exc})") from None
    return n, c, loss


def reproduce(
    path: str | Path | None = None,
    out_dir: str | Path | None = None,
    *,
    n_resamples: int = 4000,
    seed: int = 42,
    fit: Fit | None = None,
) -> dict:
    """Fit L(N, D) (law ``additive``) on the 240 points from Hoffmann's grid with ``n_resamples`` bootstrap
    refits, and compare with Epoch's estimates.

    Returns (and with ``out_dir`` writes as ``fit.json`` + ``report.md`` + ``loss_nd.png/svg``) the fit,
    the bootstrap standard errors and intervals, and for each parameter the distance to Epoch's estimate
    in units of Epoch's standard error. ``fit`` is a fit already made on the same data, used as it is (with
    its own refits, if any).
    """

    data = load_chinchilla(path)
    inputs = {"N": data.N, "D": data.D}
    if fit is None:
        fit = fitter.fit(
            "additive", {**inputs, "loss": data.loss}, bootstrap=n_resamples, seed=seed, label="Chinchilla"
        )
    boot = fit.boot_params()
    intervals = fit.param_intervals()
    rows = {}
    for name, epoch in EPOCH_ESTIMATES.items():
        value = fit.params[name]
        rows[name] = {
            "ours": value,
            "ours_se": float(np.std(boot[name], ddof=1)) if name in boot and boot[name].size > 1 else None,
            "ours_interval": intervals.get(name),
            "epoch": epoch,
            "epoch_se": EPOCH_STANDARD_ERRORS[name],
            "z_vs_epoch": (value - epoch) / EPOCH_STANDARD_ERRORS[name],
            "hoffmann": HOFFMANN_ESTIMATES[name],
        }
    result = {
        "n_points": int(data.loss.size),
        "dropped_losses": data.dropped_loss.tolist(),
        "fit": fit.to_dict(),
        "comparison": rows,
    }
    if out_dir is not None:
        # deferred for start-up time: loads matplotlib only when called
        from matplotlib.figure import Figure

        from trilm.scaling.plots import draw_nd

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_text(out / "fit.json", json.dumps(result, indent=1) + "\n")
        write_text(out / "report.md", render_comparison(result))
        law = FittedPoints(fit, inputs, data.loss, [""] * data.loss.size)
        fig = Figure(figsize=(7, 4.8))
        draw_nd(fig.subplots(), law, "Chinchilla (Epoch's 240 points): L(N, D) fit, lines at 8 sizes")
        for ext in ("png", "svg"):
            fig.savefig(out / f"loss_nd.{ext}", dpi=150 if ext == "png" else None, bbox_inches="tight")
    return result


def render_comparison(result: dict) -> str:
    """Markdown table: our estimates, bootstrap SEs and intervals next to Epoch's and Hoffmann's."""
    lines = [
        "# Chinchilla approach 3: reproduction of Epoch AI's estimates",
        "",
        f"{result['n_points']} points (5 highest losses dropped), D = FLOP / 6N, Huber δ = 1e-3 summed over"
        f" log residuals, L-BFGS from Hoffmann's {result['fit']['n_starts']} starts.",
        "",
        "| param | ours | bootstrap SE | 95% interval | Epoch | Epoch SE | (ours − Epoch) / Epoch SE"
        " | Hoffmann |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in result["comparison"].items():
        interval = (
            f"[{r['ours_interval'][0]:.4g}, {r['ours_interval'][1]:.4g}]" if r["ours_interval"] else "–"
        )
        se = f"{r['ours_se']:.4g}" if r["ours_se"] is not None else "–"
        lines.append(
            f"| {name} | {r['ours']:.4g} | {se} | {interval} | {r['epoch']:.4g} | {r['epoch_se']:.4g} |"
            f" {r['z_vs_epoch']:+.3f} | {r['hoffmann']:.4g} |"
        )
    return "\n".join(lines) + "\n"
