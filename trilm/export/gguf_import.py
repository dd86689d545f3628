"""``trilm import gguf FILE.gguf OUT``: a llama-architecture GGUF file as a float trilm snapshot.

The work is done by the libraries that own it. transformers' GGUF loader reads the file — the ``gguf``
package dequantizes every tensor type it knows (F32/F16/BF16, Q4_0…Q8_0, the K-quants, …), and the loader
maps names, undoes llama.cpp's q/k row interleave and turns the metadata into a ``LlamaConfig`` — and
transformers rebuilds the tokenizer from the file's ``tokenizer.ggml.*`` metadata. trilm then holds both to
what the file says, read independently with ``gguf.GGUFReader``:

- every metadata key of the architecture is one trilm reads or refuses by name (transformers' llama
  mapping silently drops RoPE scaling keys and the ``rope_freqs`` tensor; importing without them would
  change the logits), and ``linear`` RoPE scaling is carried over;
- the rebuilt tokenizer has the file's tokens id for id, its merges, its special ids and chat template, and
  encodes probe texts exactly as transformers' own tokenizer of the file does once saved and reloaded.

The weights are the file's, dequantized to fp32: a Q4_1 file imports as the fp32 model that *is* its
Q4_1 weights, not the model it was quantized from (the snapshot's meta records the tensor types). Tied
embeddings (no ``output.weight``) are imported as a head that copies the embedding, recorded so exports
tie them again.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from trilm.config import ConfigError
from trilm.data.tokenizer import Tokenizer
from trilm.export.gguf_check import open_gguf
from trilm.model.hf import hf_tensor_plan, model_config_from_hf
from trilm.model.snapshot import model_meta
from trilm.store.snapshot import write_snapshot

ARCH = "llama"
_READ_KEYS = {
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.layer_norm_rms_epsilon",
    "rope.freq_base",
    "rope.dimension_count",
    "vocab_size",
    "attention.key_length",
    "attention.value_length",
    "rope.scaling.type",
    "rope.scaling.factor",
}
"""``llama.*`` keys trilm reads; any other key of the architecture is refused by name."""
PROBE_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "  two leading spaces,   three inside, trailing  ",
    "\n\nnew\nlines\tand\ttabs\r\n",
    "digits 1234567890 and 3.14159, 2025-01-01",
    "naïve café, 漢字, ☃ and 🙂",
    "def f(x):\n    return x ** 2  # code\n",
    "I'm sure they'll say it's fine — «quotes» and ‘apostrophes’",
)


@dataclasses.dataclass
class GGUFImport:
    out: Path
    tensor_types: dict[str, int]
    tied: bool
    tokenizer: str
    probes: int
    seconds: float

    def summary(self) -> str:
        types = ", ".join(f"{k} ×{v}" for k, v in sorted(self.tensor_types.items(), key=lambda kv: -kv[1]))
        tie = (
            "; embeddings tied in the file: head.weight is a copy of token_embd (exports tie them again)"
            if self.tied
            else ""
        )
        return (
            f"wrote snapshot {self.out}: llama GGUF ({types}) dequantized to fp32{tie}; tokenizer "
            f"{self.tokenizer}, equal to transformers' reading of the file on {self.probes} probe texts "
            f"({self.seconds:.1f} s)"
        )


def _field(reader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _count(reader, key: str, path: Path) -> int | None:
    """An integer metadata value (None when absent); any other value is refused naming the key."""
    value = _field(reader, key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{path}: metadata key {key} is {value!r}, not an integer")
    return value


def read_rope_scaling(reader, path: Path) -> dict[str, Any] | None:
    """The ``rope_scaling`` of config.json that the file's RoPE keys mean (None: plain RoPE); refused by
    name where trilm cannot represent them."""
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise ConfigError(
            f"{path}: tensor rope_freqs.weight (per-frequency RoPE factors, as llama.cpp stores Llama-3.1 "
            "'llama3' scaling) is not supported: trilm reads llama3 scaling from a config.json's "
            "rope_scaling; import the Hugging Face directory instead"
        )
    kind = _field(reader, f"{ARCH}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    if kind != "linear":
        raise ConfigError(f"{path}: {ARCH}.rope.scaling.type {kind!r} is not supported (none or linear)")
    factor = _field(reader, f"{ARCH}.rope.scaling.factor")
    if factor is None:
        raise ConfigError(f"{path}: {ARCH}.rope.scaling.type linear without {ARCH}.rope.scaling.factor")
    if isinstance(factor, (str, list)):
        raise ConfigError(f"{path}: {ARCH}.rope.scaling.factor is {factor!r}, not a number")
    return {"rope_type": "linear", "factor": float(factor)}


def check_metadata(reader, path: Path) -> None:
    """Refuse a file whose architecture or metadata trilm cannot represent, naming the key."""
    arch = _field(reader, "general.architecture")
    if arch is None:
        raise ConfigError(
            f"{path}: metadata has no general.architecture ({len(reader.fields) - 3} keys, "
            f"{len(reader.tensors)} tensors): not a model file trilm can import"
        )
    if arch != ARCH:
        raise ConfigError(
            f"{path}: general.architecture {arch!r}: trilm imports llama-architecture GGUF files "
            "(LlamaForCausalLM and its variants: SmolLM, TinyLlama, Llama 2/3, …)"
        )
    for key in reader.fields:
        if key.startswith(f"{ARCH}.") and key[len(ARCH) + 1 :] not in _READ_KEYS:
            raise ConfigError(
                f"{path}: metadata key {key} is not supported (importing it would change the model)"
            )
    key_length = _count(reader, f"{ARCH}.attention.key_length", path)
    rotary = _count(reader, f"{ARCH}.rope.dimension_count", path)
    value_length = _count(reader, f"{ARCH}.attention.value_length", path)
    if key_length is not None and rotary is not None and key_length != rotary:
        raise ConfigError(
            f"{path}: {ARCH}.rope.dimension_count {rotary} != attention.key_length {key_length}: partial "
            "rotary embeddings are not supported"
        )
    if key_length is not None and value_length is not None and key_length != value_length:
        raise ConfigError(
            f"{path}: {ARCH}.attention.key_length and value_length differ ({key_length}, {value_length})"
        )


def _tensor_types(reader, path: Path) -> dict[str, int]:
    # deferred for start-up time: loads gguf only when called
    from gguf import GGMLQuantizationType as T
    from gguf.quants import _type_traits

    counts: Counter[str] = Counter()
    for t in reader.tensors:
        if t.tensor_type not in (T.F32, T.F16) and t.tensor_type not in _type_traits:
            raise ConfigError(
                f"{path}: tensor {t.name} is {t.tensor_type.name}, a type the gguf package cannot dequantize"
            )
        counts[t.tensor_type.name] += 1
    return dict(counts)


def rebuild_tokenizer(path: Path, reader, into: Path):
    """The file's tokenizer rebuilt by transformers, saved into ``into`` and loaded back by trilm; checked
    against the metadata (tokens, merges, special ids, chat template) and on :data:`PROBE_TEXTS` against
    transformers' own reading of the file."""
    # deferred for start-up time: loads transformers only when called
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    except Exception as exc:
        raise ConfigError(
            f"{path}: transformers cannot rebuild the tokenizer ({type(exc).__name__}: {exc})"
        ) from None
    finally:
        hf_logging.set_verbosity(verbosity)
    template = _field(reader, "tokenizer.chat_template")
    if template and not theirs.chat_template:
        theirs.chat_template = template
    theirs.save_pretrained(str(into))
    ours = Tokenizer.load(into / "tokenizer.json")
    tokens = _field(reader, "tokenizer.ggml.tokens") or []
    vocab = ours.vocabulary()
    by_id = {i: t for t, i in vocab.items()}
    wrong = [i for i, t in enumerate(tokens) if by_id.get(i) != t]
    if wrong or len(vocab) != len(tokens):
        raise ConfigError(
            f"{path}: the rebuilt tokenizer differs from tokenizer.ggml.tokens ({len(wrong)} ids differ, "
            f"{len(vocab)} vs {len(tokens)} tokens); refusing to import a tokenizer that changes the ids"
        )
    merges = _field(reader, "tokenizer.ggml.merges")
    if merges:
        model = json.loads((into / "tokenizer.json").read_text())["model"]
        rebuilt = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
        if rebuilt != list(merges):
            raise ConfigError(f"{path}: the rebuilt tokenizer's merges differ from tokenizer.ggml.merges")
    for kind in ("bos", "eos", "unk"):
        want = _field(reader, f"tokenizer.ggml.{kind}_token_id")
        got = getattr(ours, f"{kind}_id")
        if want is not None and int(want) != got:
            raise ConfigError(
                f"{path}: tokenizer.ggml.{kind}_token_id is {want}, the rebuilt tokenizer's {got}"
            )
    if template and ours.chat_template != template:
        raise ConfigError(f"{path}: tokenizer.chat_template was not carried into the rebuilt tokenizer")
    for text in PROBE_TEXTS:
        want = theirs(text, add_special_tokens=False)["input_ids"]
        got = ours.encode(text)
        if got != want:
            raise ConfigError(
                f"{path}: the saved tokenizer encodes {text!r} as {got[:12]}…, transformers' reading of the "
                f"file as {want[:12]}…"
            )
        if ours.decode(got) != theirs.decode(want):
            raise ConfigError(f"{path}: the saved tokenizer decodes {text!r} differently from transformers")
    return ours


def _meta_model(config: dict[str, Any]):
    """A weightless ``LlamaForCausalLM`` of the file's config: transformers maps tensor names through it."""
    # deferred for start-up time: loads transformers only when called
    from transformers import LlamaConfig, LlamaForCausalLM

    keys = {
        k: v for k, v in config.items() if k not in ("model_type", "architectures", "_model_name_or_path")
    }
    with torch.device("meta"):
        return LlamaForCausalLM(LlamaConfig(**keys))


def import_gguf(path: str | Path, out: str | Path, *, family: str = "floatlm") -> GGUFImport:
    """Import a llama GGUF file into a new snapshot directory (see the module docstring)."""
    # deferred for start-up time: loads transformers only when called
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    start = time.perf_counter()
    path, out = Path(path), Path(out)
    if not path.is_file():
        raise ConfigError(f"{path}: no such GGUF file")
    if out.is_file() or (out.is_dir() and any(out.iterdir())):
        raise ConfigError(f"{out}: exists and is not empty; import into a new directory")
    reader = open_gguf(path)
    check_metadata(reader, path)
    types = _tensor_types(reader, path)
    rope_scaling = read_rope_scaling(reader, path)
    try:
        config = dict(load_gguf_checkpoint(str(path))["config"])
        parsed = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=_meta_model(config))
        config.setdefault("architectures", ["LlamaForCausalLM"])
        config["rope_scaling"] = rope_scaling
        config.pop("rope_parameters", None)
        tied = bool(config.get("tie_word_embeddings"))
        cfg = model_config_from_hf(config, family, str(path))
    except ConfigError:
        raise
    except Exception as exc:  # transformers' loader raises many kinds on metadata it cannot map
        raise ConfigError(
            f"{path}: transformers cannot convert the file's metadata and tensors "
            f"({type(exc).__name__}: {exc})"
        ) from None
    name = str(_field(reader, "general.basename") or path.stem)
    size = _field(reader, "general.size_label")
    cfg = cfg.replace(name=f"{name}-{size}" if size and str(size) not in name else name)
    tensors = parsed["tensors"]
    plan = hf_tensor_plan(cfg)
    if tied:
        plan.pop("lm_head.weight")
    missing = sorted(set(plan) - set(tensors))
    if missing:
        raise ConfigError(f"{path}: tensors missing after conversion: {missing[:4]}")
    state: dict[str, torch.Tensor] = {}
    for hf_name, (canonical, shape) in plan.items():
        tensor = tensors[hf_name].float()
        if tuple(tensor.shape) != shape:
            raise ConfigError(
                f"{path}: {hf_name} converts to shape {tuple(tensor.shape)}, the metadata says {shape}"
            )
        state[canonical] = tensor.contiguous()
    if tied:
        state["head.weight"] = state["embed.weight"].clone()
    with tempfile.TemporaryDirectory(prefix="trilm-gguf-tok-") as tmp:
        tok = rebuild_tokenizer(path, reader, Path(tmp))
        model_name = _field(reader, "tokenizer.ggml.model")
        pre = _field(reader, "tokenizer.ggml.pre")
        extra: dict[str, Any] = {
            "imported_from": path.name,
            "gguf": {
                "file": path.name,
                "tensor_types": types,
                "file_type": _field(reader, "general.file_type"),
                "dequantized_to": "float32",
                "tokenizer_model": model_name,
                "tokenizer_pre": pre,
                "tokenizer_hash": tok.hash,
            },
            "hf": {"bos_token_id": tok.bos_id if tok.bos_id >= 0 else None, "eos_token_id": tok.eos_id},
            "add_bos": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        }
        if tied:
            extra["tied_embeddings"] = True
        meta = model_meta(cfg, step=0, tokens=0, run=path.stem, tokenizer_hash=tok.hash, extra=extra)
        write_snapshot(out, cfg, meta, state, tokenizer=tok, marker={"imported_from": path.name})
    label = f"{model_name}" + (f"/{pre}" if pre else "")
    label += f" ({tok.vocab_size:,} tokens{', chat template' if tok.chat_template else ''})"
    return GGUFImport(out, types, tied, label, len(PROBE_TEXTS), time.perf_counter() - start)
