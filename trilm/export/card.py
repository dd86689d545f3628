"""The model card (``README.md``) of an export: what the model is, what it has seen, how to load it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trilm.atomic import write_text
from trilm.families import FAMILIES
from trilm.store.open import ModelDir
from trilm.store.tokenizer import prefix_token_id


def _number(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.4f}"
    return f"{int(value):,}"


def model_card(
    src: ModelDir, *, files: dict[str, str] | None = None, evals: dict[str, float] | None = None
) -> str:
    """Markdown with a YAML header that the Hugging Face hub reads (library, tags)."""
    cfg, meta = src.config, src.meta
    family = cfg.family
    tok = src.tokenizer.tokenizer
    prefix = prefix_token_id(tok, src.add_bos) if tok is not None else None
    rows = [
        ("family", family),
        ("size", meta.size or cfg.name),
        ("parameters", _number(meta.params)),
        ("non-embedding parameters", _number(meta.nonembedding_params)),
        ("step", _number(meta.step)),
        ("tokens seen", _number(meta.tokens)),
        ("training loss", _number(meta.train_loss)),
        ("validation loss (nats/token)", _number(meta.val_loss)),
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
        f"# {meta.run or cfg.name} — step {meta.step if meta.step is not None else '?'}",
        "",
        f"{cfg.name} is {FAMILIES[family].description}. Exported by trilm from `{src.label}`.",
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


def write_model_card(out_dir: Path, src: ModelDir, **kwargs) -> Path:
    return write_text(Path(out_dir) / "README.md", model_card(src, **kwargs))
