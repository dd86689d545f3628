"""The model card (``README.md``) of an export: what the model is, what it has seen, how to load it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trilm.export.common import SnapshotSource
from trilm.export.tokenizer import prefix_token_id
from trilm.families import FAMILIES


def _number(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.4f}"
    return f"{int(value):,}"


def model_card(
    src: SnapshotSource, *, files: dict[str, str] | None = None, evals: dict[str, float] | None = None
) -> str:
    """Markdown with a YAML header that the Hugging Face hub reads (library, tags)."""
    cfg, meta = src.cfg, src.meta
    family = cfg.family
    prefix = None
    if src.tokenizer is not None:
        prefix = prefix_token_id(src.tokenizer, src.add_bos)
    rows = [
        ("family", family),
        ("size", meta.get("size", cfg.name)),
        ("parameters", _number(meta.get("params"))),
        ("non-embedding parameters", _number(meta.get("nonembedding_params"))),
        ("step", _number(meta.get("step"))),
        ("tokens seen", _number(meta.get("tokens"))),
        ("training loss", _number(meta.get("train_loss"))),
        ("validation loss (nats/token)", _number(meta.get("val_loss"))),
        (
            "hidden / FFN / heads / kv heads / layers",
            f"{cfg.hidden} / {cfg.ffn} / {cfg.heads} / {cfg.num_kv_heads} / {cfg.layers}",
        ),
        ("context, RoPE θ", f"{cfg.context}, {cfg.rope_theta:g}"),
        ("vocabulary (padded)", f"{cfg.vocab_size} ({cfg.padded_vocab})"),
    ]
    if family != "floatlm":
        rows.append(("scale group, partitions", f"{cfg.quant.scale_group}, {cfg.scale_partitions(1)}"))
    lines = [
        "---",
        "library_name: transformers",
        f"tags: [trilm, {FAMILIES[family].weight_format}]",
        "---",
        "",
        f"# {meta.get('run') or cfg.name} — step {meta.get('step', '?')}",
        "",
        f"{cfg.name} is {FAMILIES[family].description}. Exported by trilm from `{src.path}`.",
        "",
        "| | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in rows],
    ]
    if evals:
        lines += ["", "## Evaluations", "", "| evaluation | value |", "|---|---|"]
        lines += [f"| {k} | {_number(v)} |" for k, v in sorted(evals.items())]
    if files:
        lines += ["", "## Files", ""] + [f"- {k}: `{v}`" for k, v in files.items()]
    bos = "with" if src.add_bos else "without"
    lines += [
        "",
        "## Tokenization",
        "",
        f"The model was trained {bos} a BOS token: documents are their tokens followed by EOS. The "
        f"tokenizer files say so (`add_bos_token: {str(src.add_bos).lower()}`), so transformers and "
        "llama.cpp encode as in training.",
    ]
    if prefix is not None:
        lines += [
            f"For log-likelihoods with an empty context, condition on token {prefix} "
            f"(lm-eval: `--model hf --model_args pretrained=DIR,prefix_token_id={prefix}`; trilm's own "
            "`--model trilm` does this by itself).",
        ]
    lines += [
        "",
        "## Usage",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        'tok = AutoTokenizer.from_pretrained("DIR")',
        'model = AutoModelForCausalLM.from_pretrained("DIR")',
        'ids = tok("In the beginning", return_tensors="pt").input_ids',
        "print(tok.decode(model.generate(ids, max_new_tokens=20)[0]))",
        "```",
        "",
    ]
    return "\n".join(lines)


def write_model_card(out_dir: Path, src: SnapshotSource, **kwargs) -> Path:
    path = Path(out_dir) / "README.md"
    path.write_text(model_card(src, **kwargs))
    return path
