"""What a GGUF reader sees: the model a GGUF file declares, read back with the ``gguf`` package's reader.

A GGUF file describes its model twice: once in its metadata (block count, head counts, FFN widths, head
size) and once in its tensors. A reader sizes every tensor from the metadata, so the two must agree or no
reader can load the file. The GGUF export checks its own file through this view before moving it into
place (:func:`check_declared_shapes`): the model the metadata declares — per-layer head counts and FFN
widths as arrays where blocks differ — must have exactly the file's tensors, with their shapes.

:func:`declared_config` turns the metadata into a trilm config of the float model the file holds, so the
architecture spec (:mod:`trilm.model.spec`) says which tensors it must have and how large they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trilm.config import ConfigError
from trilm.export.gguf_check import open_gguf
from trilm.model.config import ModelConfig
from trilm.model.spec import canonical_shapes, gguf_name


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _per_layer(value: Any, layers: int, key: str, path: Path) -> list[int]:
    """A per-block count given as one number for every block or as an array with one per block."""
    if isinstance(value, list):
        if len(value) != layers:
            raise ConfigError(f"{path}: {key} has {len(value)} entries for {layers} blocks")
        return [int(v) for v in value]
    return [int(value)] * layers


def declared_config(reader: Any, path: str | Path) -> ModelConfig:
    """The (float) model a GGUF file's metadata declares, as a trilm config; a declaration trilm cannot
    represent (attention with query heads but no KV heads, a varying GQA group) is refused by name."""
    path = Path(path)
    arch = _field(reader, "general.architecture")
    if arch is None:
        raise ConfigError(f"{path}: no general.architecture")
    try:
        layers = int(_field(reader, f"{arch}.block_count"))
        hidden = int(_field(reader, f"{arch}.embedding_length"))
        heads = _per_layer(_field(reader, f"{arch}.attention.head_count"), layers, "head_count", path)
        kv = _per_layer(_field(reader, f"{arch}.attention.head_count_kv"), layers, "head_count_kv", path)
        ffn = _per_layer(_field(reader, f"{arch}.feed_forward_length"), layers, "feed_forward_length", path)
        head_dim = int(_field(reader, f"{arch}.attention.key_length") or hidden // max(heads))
    except (TypeError, ValueError, OverflowError, ZeroDivisionError):
        raise ConfigError(
            f"{path}: {arch}: block count, widths, head counts or head size are missing or not counts"
        ) from None
    if head_dim <= 0:
        raise ConfigError(f"{path}: {arch}.attention.key_length: head size {head_dim} is not positive")
    groups = set()
    for i, (h, k) in enumerate(zip(heads, kv)):
        if (h == 0) != (k == 0) or (k and h % k):
            raise ConfigError(f"{path}: block {i} declares {h} query and {k} KV heads; trilm cannot hold it")
        if k:
            groups.add(h // k)
    if len(groups) > 1:
        raise ConfigError(f"{path}: the query heads per KV head differ between blocks ({sorted(groups)})")
    group = groups.pop() if groups else 1
    full_heads = hidden // head_dim
    explicit = None
    if len(set(zip(heads, kv, ffn))) == 1 and heads[0] and heads[0] * head_dim != hidden:
        full_heads, explicit = heads[0], head_dim  # a head size that is not hidden / heads, said outright
    vocab = int(_field(reader, f"{arch}.vocab_size") or len(_field(reader, "tokenizer.ggml.tokens", [])))
    uniform = len(set(zip(heads, kv, ffn))) == 1 and heads[0] == full_heads
    try:
        return ModelConfig(
            family="floatlm",
            name=str(_field(reader, "general.name", "gguf")),
            vocab_size=vocab,
            pad_vocab_to=1,
            hidden=hidden,
            ffn=max(ffn) or 1,
            heads=full_heads,
            kv_heads=full_heads // group,
            explicit_head_dim=explicit,
            layers=layers,
            context=int(_field(reader, f"{arch}.context_length", 2048)),
            rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
            norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
            layer_kv_heads=None if uniform else kv,
            layer_ffn=None if uniform else ffn,
        )
    except ConfigError as exc:
        raise ConfigError(f"{path}: metadata: {exc}") from None


def check_declared_shapes(path: str | Path) -> ModelConfig:
    """Read ``path`` with ``gguf.GGUFReader`` and check that its tensors are exactly those of the model its
    metadata declares, with the declared shapes; returns that model's config. A mismatch is a ConfigError
    naming the tensors (a file no reader could load as written)."""
    reader = open_gguf(path)
    cfg = declared_config(reader, path)
    expected = {gguf_name(k): shape for k, shape in canonical_shapes(cfg).items()}
    found = {t.name: tuple(int(n) for n in reversed(t.shape.tolist())) for t in reader.tensors}
    if "output.weight" not in found:  # tied embeddings: llama.cpp reads token_embd as the head
        expected.pop("output.weight")
    if "rope_freqs.weight" in found:  # Llama-3.1 RoPE scaling: one factor per rotary frequency
        expected["rope_freqs.weight"] = (cfg.head_dim // 2,)
    problems = [f"{n} missing" for n in expected if n not in found]
    problems += [f"{n} not declared" for n in found if n not in expected]
    problems += [
        f"{n} {found[n]} where the metadata says {s}"
        for n, s in expected.items()
        if n in found and found[n] != s
    ]
    if problems:
        raise ConfigError(f"{path}: tensors disagree with the declared model: {'; '.join(problems[:4])}")
    return cfg
