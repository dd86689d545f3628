"""Where a quantized SmolLM2's hidden states leave the float model's, block by block: the measurement behind
the report's answer to why OmniQuant trails GPTQ on this model.

    python -m experiments.posthoc_real.blocks --rows gptq-w3,omniquant-w3,omniquant-w3-e20

OmniQuant trains each block's clipping to minimise ``MSE(float block output, quantized block output)`` with
the quantized model's own inputs — the same quantity this script measures for every finished row of
:mod:`experiments.posthoc_real.run`: the float model and the quantized one run side by side on the calibration
windows, and after every block it records the mean squared difference of the two residual streams, the share
of it that sits at each window's first position, the share at the single (window, position) with the largest
error, and the float stream's largest |h| (massive activations, which make a few positions dominate a mean).
The measurements are :mod:`trilm.posthoc.divergence`. Written to ``docs/results/posthoc-real/blocks.json`` and
``blocks.png``; the report renders a summary.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from benchmarks.common import CHECKOUT, write_result
from experiments.posthoc_real.run import calibration_windows
from trilm.posthoc.divergence import FloatFirstPosition, calibration_nll, divergence

ROOT = CHECKOUT
WORK = ROOT / "data_cache" / "posthoc-real"
OUT = ROOT / "docs" / "results" / "posthoc-real"
CORPUS = ROOT / "trilm" / "data" / "corpus"


def pinned_perplexity(model: Path, float_model, eval_tokens: int, seq_len: int) -> dict:
    """Perplexity of ``model`` as it is and with its first position pinned to the float model's
    (:class:`FloatFirstPosition`) on :mod:`experiments.posthoc_real.run`'s held-out text and windows. Both are
    measured here, on the model as it is on disk now, so the pair compares like with like even where the row
    in the table was measured on another machine."""
    from trilm.eval.model import load_eval_model
    from trilm.eval.ppl import evaluate_perplexity

    em = load_eval_model(model)
    quant_model = em.model
    out = {}
    for key, pin in (("ppl", False), ("ppl_pinned", True)):
        em.model = FloatFirstPosition(quant_model, float_model, pin=pin)
        result = evaluate_perplexity(
            em, CORPUS, split="validation", max_tokens=eval_tokens, seq_len=seq_len, batch_size=4
        )
        out[key] = result.ppl
    return out


def hybrid_perplexity(base: Path, donor: Path, prefixes: list[str], eval_tokens: int, seq_len: int) -> dict:
    """Perplexity of ``base`` with the block linears whose names start with one of ``prefixes`` taken from
    ``donor`` (same format and bits): which weights a method's loss comes from. The held-out text and windows
    are :mod:`experiments.posthoc_real.run`'s, so the unmixed models reproduce its rows."""
    from trilm.eval.model import load_eval_model
    from trilm.eval.ppl import evaluate_perplexity

    em = load_eval_model(base)
    swapped = []
    if prefixes:
        donor_linears = load_eval_model(donor).model.linear_modules()
        for name in em.model.linear_modules():
            if any(name.startswith(prefix) for prefix in prefixes):
                em.model.set_linear(name, donor_linears[name])
                swapped.append(name)
        if not swapped:
            raise SystemExit(f"no block linear of {base} starts with {prefixes}")
    result = evaluate_perplexity(
        em, CORPUS, split="validation", max_tokens=eval_tokens, seq_len=seq_len, batch_size=4
    )
    return {
        "base": base.name,
        "donor": donor.name if prefixes else None,
        "swapped": swapped,
        "ppl": result.ppl,
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    for name, blocks in results["rows"].items():
        x = [b["block"] for b in blocks]
        top.plot(x, [b["mse"] for b in blocks], marker="o", ms=3, label=name)
        bottom.plot(x, [b["share_first_position"] for b in blocks], marker="o", ms=3, label=name)
    float_peak = next(iter(results["rows"].values()))
    twin = top.twinx()
    twin.plot(
        [b["block"] for b in float_peak],
        [b["float_max_abs"] for b in float_peak],
        "k:",
        label="float max |h|",
    )
    twin.set_ylabel("float model's largest |h| (dotted)")
    twin.set_yscale("log")
    top.set_yscale("log")
    top.set_ylabel("MSE of the residual stream vs float")
    top.set_title("SmolLM2-135M: how far each quantized model drifts from float, block by block")
    top.legend(loc="upper left", fontsize=8)
    bottom.set_ylabel("share of that error at position 0")
    bottom.set_ylim(0, 1.02)
    bottom.set_xlabel("block")
    bottom.grid(alpha=0.3)
    top.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows", default="gptq-w3,omniquant-w3,omniquant-w3-e20", help="models under WORK/models"
    )
    parser.add_argument("--work", default=str(WORK))
    parser.add_argument(
        "--windows", type=int, default=8, help="calibration windows to run (of the saved set)"
    )
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument(
        "--hybrid",
        action="append",
        default=[],
        metavar="BASE:DONOR:PREFIX[,PREFIX]",
        help="also evaluate BASE with the linears under PREFIX taken from DONOR (repeatable; empty PREFIX: "
        "BASE as it is)",
    )
    parser.add_argument(
        "--pin-first",
        default="",
        help="comma-separated rows to evaluate also with position 0 pinned to the float model's",
    )
    parser.add_argument("--calib-samples", type=int, default=32, help="as experiments.posthoc_real.run")
    parser.add_argument("--calib-seq-len", type=int, default=512, help="as experiments.posthoc_real.run")
    parser.add_argument("--eval-tokens", type=int, default=8192, help="as experiments.posthoc_real.run")
    parser.add_argument("--seq-len", type=int, default=1024, help="as experiments.posthoc_real.run")
    args = parser.parse_args(argv)
    from trilm.infer.load import load_inference_model

    torch.set_num_threads(args.threads)
    work, out = Path(args.work), Path(args.out)
    snapshot = work / "smollm2-135m"
    if not (snapshot / "COMPLETE").is_file():
        raise SystemExit(
            f"{snapshot}: no snapshot (run python -m experiments.posthoc_real first; it imports the model)"
        )
    calib = calibration_windows(work, snapshot, args.calib_samples, args.calib_seq_len)
    all_windows = torch.load(calib)
    windows = all_windows[: args.windows]
    float_model = load_inference_model(snapshot)
    rows: dict[str, list[dict]] = {}
    fit = {"float": calibration_nll(float_model, all_windows, args.batch)}
    for name in [r for r in args.rows.split(",") if r]:
        path = work / "models" / name.replace(":", "-")
        if not path.is_dir():
            print(f"{name}: {path} is missing; skipped", file=sys.stderr)
            continue
        model = load_inference_model(path)
        rows[name] = divergence(float_model, model, windows, args.batch)
        fit[name] = calibration_nll(model, all_windows, args.batch)
        last = rows[name][-1]
        print(
            f"{name}: final block mse {last['mse']:.4g}, {last['share_first_position']:.1%} at position 0; "
            f"calibration NLL {fit[name]:.4f} (float {fit['float']:.4f})"
        )
    hybrids = []
    for spec in args.hybrid:
        base, donor, prefixes = spec.split(":")
        hybrid = hybrid_perplexity(
            work / "models" / base,
            work / "models" / donor,
            [p for p in prefixes.split(",") if p],
            args.eval_tokens,
            args.seq_len,
        )
        hybrids.append({**hybrid, "spec": spec})
        print(f"{spec}: ppl {hybrid['ppl']:.3f} ({len(hybrid['swapped'])} linears from {donor})")
    pinned = []
    for name in [r for r in args.pin_first.split(",") if r]:
        ppl = pinned_perplexity(work / "models" / name, float_model, args.eval_tokens, args.seq_len)
        pinned.append({"row": name, **ppl})
        print(f"{name}: ppl {ppl['ppl']:.3f}, {ppl['ppl_pinned']:.3f} with position 0 from the float model")
    results = {
        "windows": f"{calib.name}[:{args.windows}]",
        "rows": rows,
        "hybrids": hybrids,
        "pinned_first_position": pinned,
        "calibration_nll": {"windows": f"{calib.name} (all {all_windows.shape[0]})", **fit},
    }
    out.mkdir(parents=True, exist_ok=True)
    write_result(out / "blocks.json", results, module=__spec__.name, argv=argv, indent=2)
    if rows:
        plot(results, out / "blocks.png")
    print(f"wrote {out / 'blocks.json'} and blocks.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
