"""The serving benchmark's results as a console table and as the Markdown table the docs quote.

Rendering only: :mod:`benchmarks.serve` measures and writes the JSON; ``--markdown FILE`` re-renders one.
"""

from __future__ import annotations


def print_table(results: dict) -> None:
    names = list(results["ttft_ms"])
    width = max(12, *(len(n) for n in names)) + 2
    head = f"{'case':<28}" + "".join(f"{n:>{width}}" for n in names)
    print("\n" + head + "\n" + "-" * len(head))
    for length, _ in next(iter(results["ttft_ms"].values())).items():
        row = f"{f'TTFT {length} tokens (ms)':<28}"
        print(row + "".join(f"{results['ttft_ms'][n][length]:>{width}.1f}" for n in names))
    for key in next(iter(results["decode_tokens_per_s"].values())):
        row = f"{f'decode tok/s {key}':<28}"
        print(row + "".join(f"{results['decode_tokens_per_s'][n][key]:>{width}.1f}" for n in names))
    for field in ("model_mb", "kv_cache_mb", "peak_working_mb"):
        vals = [results["memory"][n].get(field) for n in names]
        print(
            f"{field:<28}" + "".join(f"{v:>{width}.1f}" if v is not None else f"{'-':>{width}}" for v in vals)
        )
    print()
    for name, values in results["ratios"].items():
        print(f"{name}: " + ", ".join(f"{k} {v:.2f}" for k, v in values.items()))
    for name, value in results["targets"].items():
        print(f"target {name}: {value}")


def markdown(report: dict) -> str:
    """The docs table of a results JSON (``--markdown FILE``): the figures, then the ratios."""
    names = list(report["ttft_ms"])
    lines = ["| case | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for length, _ in next(iter(report["ttft_ms"].values())).items():
        cells = " | ".join(f"{report['ttft_ms'][n][length]:.1f}" for n in names)
        lines.append(f"| time to first token, {length}-token prompt (ms) | {cells} |")
    for key in next(iter(report["decode_tokens_per_s"].values())):
        depth, batch = key.removeprefix("depth").split("-batch")
        cells = " | ".join(f"{report['decode_tokens_per_s'][n][key]:.0f}" for n in names)
        lines.append(f"| decode tokens/s, depth {depth}, batch {batch} | {cells} |")
    for field, label in (
        ("model_mb", "model (MB)"),
        ("kv_cache_mb", "KV cache (MB)"),
        ("peak_working_mb", "peak working memory (MB)"),
    ):
        vals = [report["memory"][n].get(field) for n in names]
        lines.append(f"| {label} | " + " | ".join("–" if v is None else f"{v:.1f}" for v in vals) + " |")
    lines.append("")
    for name, values in report["ratios"].items():
        lines.append(f"- {name}: " + ", ".join(f"{k} **{v:.2f}**" for k, v in values.items()))
    return "\n".join(lines)
