"""GGUF for llama.cpp through the ``gguf`` package: F16, Q8_0, Q4_0, Q4_1 for any family, TQ2_0/TQ1_0 for
TriLM/BiLM.

**Q4_0 / Q4_1 / Q8_0 of a QuantLM** on llama.cpp's grid (``trilm quantize --target gguf-q4_0`` …, or any
symmetric W4/W8 group-32 QuantLM with fp16 scales) are written block for block from its codes and fp16
numbers (:func:`trilm.formats.ggml_blocks`), so the file holds exactly the QuantLM's values; that is the
default type for such a QuantLM. A QuantLM off that grid is refused for Q4_0/Q4_1 (re-quantizing a quantized
model would change it) and re-quantized from its dequantized weights for Q8_0. A float model
gets llama.cpp's own quantization of its weights (``gguf.quants``, the reference rounding).

The file is a llama-architecture GGUF as llama.cpp's own converter writes one: tensor names
``token_embd``/``blk.N.attn_q``/…/``output``, q and k rows permuted from the rotate-half RoPE layout
(trilm's and Hugging Face's) to llama.cpp's interleaved pairs, norms in F32, the SentencePiece vocabulary
(padded with ``[PADi]`` tokens to the embedding rows) with ``add_bos_token`` as trained. A structurally pruned
model (per-layer head counts and FFN widths) is written as llama.cpp's ``deci`` architecture, whose metadata
holds those as per-block arrays (:func:`file_blocks` says which blocks go in and which cannot).

**TQ1_0 / TQ2_0** hold one fp16 scale per 256 consecutive weights of a row. A ternary matrix is stored
exactly when every 256-block has one non-zero magnitude. Two cases are not so:

- a row length that is not a multiple of 256: refused (nothing can be done inside the format), unless
  ``fallback`` (``--fallback f16|q8_0``) names a type for those tensors, as llama.cpp's own converter does
  for them: the file's type is then a "mostly TQ" type, the tensors in the other type are listed in its
  ``trilm.fallback_tensors`` and in the report. F16 holds a ternary tensor exactly as TQ would (codes times
  the fp16-rounded scale); Q8_0 within its error bound, at about half F16's size;
- blocks that straddle a tensor-parallel scale boundary, e.g. Spectra-1.1B's ``o_proj``: 1,792 columns in
  2 partitions of 896. The scale of a row-parallel matrix varies only along its input columns, and those
  columns are outputs of the previous matrix *through a linear path* (an attention head's values are a
  weighted sum of ``v_proj`` rows; ``down_proj``'s inputs are ``silu(gate) · up``). So the column scales
  are folded into the rows of ``v_proj`` (``up_proj``): o_proj[:, j] / r_j and v_proj[j, :] · r_j give the
  same model, and every block of the folded matrix has one magnitude. Anything else (scales that vary
  along rows and columns within a block, kv groups with different column scales) is refused.

There is never a silent fallback: without ``fallback`` a file whose type says TQ1_0 holds only TQ1_0 block
weights, and with it every tensor not in TQ blocks is named. A weight beyond fp16's
range (|w| > 65,504, or a block scale that would be) is refused by tensor name before anything is
written: fp16 would store ±inf. After writing, the file is read back with ``gguf.GGUFReader`` and every
tensor is dequantized and compared with what was meant to be stored (exact codes and fp16 scales for TQ
and F16, the Q8_0 error bound for Q8_0; a NaN or ±inf read back is a failure, never a match), and the model
the metadata declares must have exactly the file's tensors, with their shapes (:mod:`trilm.export.gguf_read`).

The metadata names the source by its run and step (``trilm.source``), never by a path of the machine that
wrote the file.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trilm.config import ConfigError
from trilm.export.common import export_file, open_source
from trilm.export.gguf_read import check_declared_shapes
from trilm.export.hf import float_state, tie_state
from trilm.export.tokenizer import sentencepiece_proto
from trilm.formats import GGML_TYPES, ggml_blocks, ggml_type_of
from trilm.model.config import ModelConfig
from trilm.model.ops import rope_inv_freq
from trilm.model.spec import ATTENTION, MLP, gguf_name, linears_of, parse_key, weight_key
from trilm.store.open import ModelDir

QTYPES = ("f16", "q8_0", "q4_0", "q4_1", "tq1_0", "tq2_0")
FALLBACKS = ("f16", "q8_0")
"""Types a ternary tensor whose rows TQ blocks cannot hold may be written in, when asked."""
UNIFORM_ARCH = "llama"
PER_LAYER_ARCH = "deci"
"""llama.cpp's architecture of LLaMA blocks with per-block head counts and FFN widths (0 heads = no
attention), used for structurally pruned models: its loader sizes every block from arrays."""
TQ_BLOCK = 256
Q8_BLOCK = 32
FP16_MAX = 65504.0


def interleave_rope_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of q/k from rotate-half pairs (j, j + d/2) to llama.cpp's interleaved pairs (2j, 2j + 1)."""
    out, k = w.shape
    hd = out // heads
    return w.reshape(heads, 2, hd // 2, k).transpose(1, 2).reshape(out, k)


def single_magnitude_blocks(w: torch.Tensor, block: int = TQ_BLOCK) -> bool:
    """True when every ``block`` consecutive weights of a row have at most one non-zero magnitude."""
    a = w.abs().float().reshape(w.shape[0], -1, block)
    top = a.amax(-1, keepdim=True)
    return bool(((a == 0) | (a == top)).all())


def _column_scales(w: torch.Tensor) -> torch.Tensor | None:
    """Per-column magnitude c_j when W[:, j] ∈ c_j·{−1, 0, +1} for every column, else None."""
    a = w.abs().float()
    c = a.amax(0)
    if not bool(((a == 0) | (a == c)).all()):
        return None
    return torch.where(c > 0, c, torch.ones_like(c))


def file_blocks(cfg: ModelConfig, where: Path) -> list[int]:
    """The trilm blocks the file holds, in order. A block whose attention and MLP were both pruned away
    computes the identity and is left out. A block that keeps its attention but lost its MLP is refused:
    llama.cpp's per-layer graph skips the rest of such a layer, the attention's residual add included, so
    the file would run as another model."""
    blocks = []
    for i, layer in enumerate(cfg.layer_shapes()):
        if ATTENTION.present(layer) and not MLP.present(layer):
            raise ConfigError(
                f"{where}: block {i} keeps its attention but has no MLP (pruned to FFN width 0); llama.cpp's "
                f"{PER_LAYER_ARCH} graph drops the attention output of an FFN-free block, so a GGUF of it "
                "would not be this model (export hf is refused too; use the trilm snapshot or export packed)"
            )
        if ATTENTION.present(layer) or MLP.present(layer):
            blocks.append(i)
    if not blocks:
        raise ConfigError(f"{where}: every block was pruned away; there is no model to write")
    return blocks


@dataclasses.dataclass
class GGUFReport:
    path: Path
    qtype: str
    tensors: int
    folded: list[str]
    max_error: dict[str, float]
    bytes: int
    blocks: int
    fallback: dict[str, str] = dataclasses.field(default_factory=dict)
    """GGUF tensor name → the type it was written in instead of ``qtype`` (``--fallback``)."""

    def summary(self) -> str:
        folded = f"; scales folded into {', '.join(self.folded)}" if self.folded else ""
        if self.fallback:
            kinds = sorted(set(self.fallback.values()))
            folded += (
                f"; {len(self.fallback)} tensor(s) with rows TQ blocks cannot hold written as "
                f"{'/'.join(kinds)}: {', '.join(sorted(self.fallback))}"
            )
        worst = max(self.max_error.values(), default=0.0)
        return (
            f"wrote {self.path} ({self.qtype}, {self.blocks} blocks, {self.tensors} tensors, "
            f"{self.bytes / 2**20:.2f} MiB){folded}; read back with gguf: the declared shapes hold, "
            f"max |dequantized − intended| = {worst:.3g}"
        )


def ternary_tensors(
    src: ModelDir, state: dict[str, torch.Tensor], qtype: str, fallback: str | None = None
) -> tuple[dict[str, torch.Tensor], list[str], list[str]]:
    """The block matrices as they go into TQ blocks (scales folded where needed), the folded tensors' names
    and the canonical keys left to ``fallback`` (rows not a multiple of 256); refusals name the tensor."""
    cfg = src.config
    if cfg.family == "floatlm":
        raise ConfigError(
            f"{src.path}: --type {qtype} stores ternary weights; a FloatLM is not ternary (use f16 or q8_0)"
        )
    out = dict(state)
    folded: list[str] = []
    left: list[str] = []
    group = cfg.heads // cfg.num_kv_heads
    for i, layer in enumerate(cfg.layer_shapes()):
        for lin in linears_of(layer):
            key = weight_key(i, lin.name)
            w = out[key]
            if w.shape[1] % TQ_BLOCK:
                if fallback is not None:
                    left.append(key)
                    continue
                raise ConfigError(
                    f"{src.path}: {gguf_name(key)} has rows of {w.shape[1]} weights, not a multiple of "
                    f"{TQ_BLOCK}: {qtype} cannot hold it (use --fallback f16 or q8_0 for such tensors, or "
                    "--type f16)"
                )
            if single_magnitude_blocks(w):
                continue
            c = _column_scales(w) if lin.fed_by else None
            if c is not None and lin.in_dim == "q":  # query-head columns: one scale per KV group to fold
                kv = c.reshape(layer.kv_heads, group, cfg.head_dim)
                c = kv[:, 0].reshape(-1) if bool((kv == kv[:, :1]).all()) else None
            if c is None or lin.fed_by is None:
                raise ConfigError(
                    f"{src.path}: {gguf_name(key)}: its 256-weight blocks hold more than one scale and the "
                    f"scales cannot be folded into a neighbouring matrix; {qtype} would change the model "
                    "(use --type f16)"
                )
            ratio = c / c.max()
            prev_key = weight_key(i, lin.fed_by)
            if lin.in_dim == "q":
                columns = ratio.reshape(layer.kv_heads, 1, cfg.head_dim).expand(-1, group, -1).reshape(-1)
            else:
                columns = ratio
            out[key] = (w.float() / columns.unsqueeze(0)).to(w.dtype)
            out[prev_key] = (out[prev_key].float() * ratio.unsqueeze(1)).to(w.dtype)
            prev_exact = prev_key in left or single_magnitude_blocks(out[prev_key])
            if not (single_magnitude_blocks(out[key]) and prev_exact):
                raise ConfigError(f"{src.path}: {gguf_name(key)}: folding its scales did not make it exact")
            folded.append(gguf_name(key))
    return out, folded, left


def _pad_vocab(tokens: list[bytes], scores: list[float], types: list[int], rows: int) -> None:
    # deferred for start-up time: loads gguf only when called
    from gguf import TokenType

    for i in range(len(tokens), rows):
        tokens.append(f"[PAD{i}]".encode())
        scores.append(-1000.0)
        types.append(int(TokenType.UNUSED))


def bpe_vocab(src: ModelDir, rows: int, pre: str | None) -> dict:
    """A Hugging Face byte-level BPE tokenizer as llama.cpp's ``gpt2`` tokenizer model: tokens and merges
    as the ``gguf`` package reads them from ``tokenizer.json`` (added special tokens as CONTROL), padded to
    ``rows``, and the pre-tokenizer name llama.cpp splits text with.

    That name is not in ``tokenizer.json``: it is the one recorded when the model (or the model it was
    trained from, ``init_from``) was imported from a GGUF file, for the same tokenizer hash, or the one given
    (``--tokenizer-pre``); without either the export is refused by name rather than guessed (a wrong one
    makes llama.cpp split text differently)."""

    # deferred for start-up time: loads gguf only when called
    from gguf import TokenType
    from gguf.vocab import BpeVocab, SpecialVocab

    tok = src.tokenizer.require(src.given)
    recorded = src.meta.extra.get("gguf", {})
    if pre is None and recorded.get("tokenizer_hash") == tok.hash:
        pre = recorded.get("tokenizer_pre")
    if not pre:
        raise ConfigError(
            f"{src.given}: tokenizer.ggml.pre: which llama.cpp pre-tokenizer {tok.path.name} uses is not "
            "recorded (neither the model nor the one it was trained from was imported from a GGUF file with "
            "this tokenizer); pass --tokenizer-pre NAME (llama.cpp's name for it: llama-bpe, smollm, gpt2, …)"
        )
    directory = tok.path.parent
    try:
        vocab = BpeVocab(directory)
    except (FileNotFoundError, ValueError) as exc:
        raise ConfigError(f"{tok.path}: not a byte-level BPE tokenizer llama.cpp can hold ({exc})") from None
    data = json.loads(tok.path.read_text())
    special = {int(t["id"]) for t in data.get("added_tokens", []) if t.get("special")}
    added = {int(t["id"]) for t in data.get("added_tokens", [])}
    by_id = {i: t for t, i in vocab.vocab.items()}
    tokens, scores, types = [], [], []
    for i, (text, score, kind) in enumerate(vocab.all_tokens()):
        text = by_id[i].encode("utf-8") if i in by_id else text
        if isinstance(text, str):
            text = text.encode("utf-8")
        tokens.append(text)
        scores.append(float(score))
        if i in special:
            kind = TokenType.CONTROL
        elif i in added:
            kind = TokenType.USER_DEFINED
        types.append(int(kind))
    _pad_vocab(tokens, scores, types, rows)
    specials = SpecialVocab(directory, load_merges=True, n_vocab=len(tokens))
    return {"tokens": tokens, "scores": scores, "types": types, "pre": pre, "special": specials}


def _vocab(src: ModelDir, rows: int) -> tuple[list[bytes], list[float], list[int]]:
    """SentencePiece pieces, scores and types, padded with unused ``[PADi]`` tokens to ``rows``."""
    # deferred for start-up time: loads gguf only when called
    from gguf import TokenType

    proto = sentencepiece_proto(src.tokenizer.require(src.given))
    tokens = [p.piece.encode("utf-8") for p in proto.pieces]
    scores = [float(p.score) for p in proto.pieces]
    types = [
        int(p.type) if int(p.type) in {t.value for t in TokenType} else int(TokenType.NORMAL)
        for p in proto.pieces
    ]
    _pad_vocab(tokens, scores, types, rows)
    return tokens, scores, types


def _intended(tensor: np.ndarray, qtype) -> np.ndarray:
    """What a tensor should read back as: F16-rounded values; TQ codes times fp16 block scales; a float
    weight in Q4_0/Q4_1: llama.cpp's reference rounding of it (``gguf.quants``)."""
    # deferred for start-up time: loads gguf only when called
    from gguf import GGMLQuantizationType as T

    if qtype in (T.Q4_0, T.Q4_1):
        # deferred for start-up time: loads gguf only when called
        from gguf import quants

        return quants.dequantize(quants.quantize(tensor, qtype), qtype)
    if qtype in (T.TQ1_0, T.TQ2_0):
        blocks = tensor.reshape(tensor.shape[0], -1, TQ_BLOCK)
        d = np.abs(blocks).max(-1, keepdims=True)
        codes = np.sign(blocks)
        return (codes * d.astype(np.float16).astype(np.float32)).reshape(tensor.shape)
    if qtype == T.F16:
        return tensor.astype(np.float16).astype(np.float32)
    return tensor


def export_snapshot_gguf(
    snapshot: str | Path,
    out: str | Path,
    *,
    qtype: str | None = None,
    tokenizer: str | Path | None = None,
    src: ModelDir | None = None,
    tokenizer_pre: str | None = None,
    fallback: str | None = None,
) -> GGUFReport:
    """Write (and verify) the GGUF of a model; see the module docstring for what is refused and for
    ``fallback``, the type of the ternary tensors TQ blocks cannot hold."""
    # deferred for start-up time: loads gguf only when called
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf import LlamaFileType as F

    src = src or open_source(snapshot, tokenizer=tokenizer, require_tokenizer=True)
    cfg = src.config
    qtype = qtype or on_grid_type(src) or ("f16" if cfg.family == "floatlm" else "tq2_0")
    if qtype not in QTYPES:
        raise ConfigError(f"--type {qtype!r}: choose one of {', '.join(QTYPES)}")
    if fallback is not None and fallback not in FALLBACKS:
        raise ConfigError(f"--fallback {fallback!r}: choose one of {', '.join(FALLBACKS)}")
    if fallback is not None and not qtype.startswith("tq"):
        raise ConfigError(
            f"--fallback {fallback}: only a tq1_0/tq2_0 export has tensors to fall back, not {qtype}"
        )
    kinds = {"f16": (T.F16, F.MOSTLY_F16), "q8_0": (T.Q8_0, F.MOSTLY_Q8_0)}
    kinds.update({"q4_0": (T.Q4_0, F.MOSTLY_Q4_0), "q4_1": (T.Q4_1, F.MOSTLY_Q4_1)})
    kinds.update({"tq1_0": (T.TQ1_0, F.MOSTLY_TQ1_0), "tq2_0": (T.TQ2_0, F.MOSTLY_TQ2_0)})
    block_type, file_type = kinds[qtype]
    state = {k: v.float() for k, v in float_state(src).items()}
    tied, _ = tie_state(src, state)
    if tied:  # llama.cpp ties a file without output.weight to token_embd
        del state["head.weight"]
    folded: list[str] = []
    left: list[str] = []
    if qtype.startswith("tq"):
        state, folded, left = ternary_tensors(src, state, qtype, fallback)
    raw = exact_blocks(src, qtype)
    for i, layer in enumerate(cfg.layer_shapes()):
        for lin in linears_of(layer):
            if lin.rope:
                heads = layer.heads if lin.out_dim == "q" else layer.kv_heads
                key = weight_key(i, lin.name)
                state[key] = interleave_rope_rows(state[key], heads)
                if key in raw:
                    raw[key] = interleave_rope_rows(raw[key], heads)
    blocks = file_blocks(cfg, src.path)
    rope_factors = None
    if cfg.rope_scaling is not None and cfg.rope_scaling.rope_type == "llama3":
        plain = rope_inv_freq(cfg.head_dim, cfg.rope_theta)
        rope_factors = (plain / rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)).numpy()
    number = {index: position for position, index in enumerate(blocks)}
    plan: dict[str, tuple[np.ndarray, Any]] = {}
    moved: dict[str, str] = {}
    stored_raw: dict[str, np.ndarray] = {}
    for name, tensor in state.items():
        array = tensor.detach().cpu().numpy().astype(np.float32)
        parsed = parse_key(name)
        gname = gguf_name(name if parsed is None else weight_key(number[parsed[0]], parsed[1]))
        if name in raw:
            stored_raw[gname] = raw[name].numpy()
        if array.ndim == 1:
            plan[gname] = (array, T.F32)
        elif parsed is not None and name in left:
            assert fallback is not None  # ternary_tensors leaves tensors over only to a fallback type
            plan[gname] = (array, kinds[fallback][0])
            moved[gname] = str(fallback)
        elif parsed is not None:
            plan[gname] = (array, block_type)
        else:  # embedding and head: F16, or Q8_0 when asked for Q8_0
            plan[gname] = (array, T.Q8_0 if qtype == "q8_0" else T.F16)
    if rope_factors is not None:  # llama.cpp divides each rotary frequency by its factor (Llama-3.1 scaling)
        plan["rope_freqs.weight"] = (rope_factors.astype(np.float32), T.F32)
    for gname, (array, kind) in plan.items():
        if kind in (T.Q8_0, T.Q4_0, T.Q4_1) and array.shape[1] % Q8_BLOCK:
            raise ConfigError(
                f"{src.path}: {gname} has rows of {array.shape[1]} weights, not a multiple of 32: {qtype} "
                "cannot hold it (use --type f16)"
            )
        if gname not in stored_raw:
            check_fp16_range(src.given, gname, array, kind)
    tok = src.tokenizer.require(src.given)
    bpe = bpe_vocab(src, cfg.padded_vocab, tokenizer_pre) if tok.kind == "hf" else None
    tokens, scores, types = (
        (bpe["tokens"], bpe["scores"], bpe["types"]) if bpe else _vocab(src, cfg.padded_vocab)
    )
    with export_file(out, "gguf", src, qtype=qtype, exact_blocks=len(stored_raw)) as tmp:
        writer = gguf.GGUFWriter(tmp, UNIFORM_ARCH if cfg.is_uniform else PER_LAYER_ARCH)
        writer.add_name(f"{src.meta.run or cfg.name} step {src.step}")
        writer.add_file_type(int(file_type))
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        writer.add_context_length(cfg.context)
        writer.add_embedding_length(cfg.hidden)
        writer.add_block_count(len(blocks))
        if cfg.is_uniform:
            writer.add_feed_forward_length(cfg.ffn)
            writer.add_head_count(cfg.heads)
            writer.add_head_count_kv(cfg.num_kv_heads)
            if cfg.explicit_head_dim is not None:
                writer.add_key_length(cfg.head_dim)
                writer.add_value_length(cfg.head_dim)
        else:  # one entry per block, and the head size said outright (block 0 may have no heads)
            shapes = [cfg.layer_shape(i) for i in blocks]
            writer.add_feed_forward_length([s.ffn for s in shapes])
            writer.add_head_count([s.heads for s in shapes])
            writer.add_head_count_kv([s.kv_heads for s in shapes])
            writer.add_key_length(cfg.head_dim)
            writer.add_value_length(cfg.head_dim)
            if len(blocks) < cfg.layers:
                writer.add_array("trilm.blocks", blocks)
        writer.add_rope_freq_base(cfg.rope_theta)
        writer.add_rope_dimension_count(cfg.head_dim)
        scaling = cfg.rope_scaling
        if scaling is not None and scaling.rope_type == "linear":
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(scaling.factor)
        writer.add_layer_norm_rms_eps(cfg.norm_eps)
        writer.add_vocab_size(cfg.padded_vocab)
        writer.add_tokenizer_model("gpt2" if bpe else "llama")
        if bpe:
            writer.add_tokenizer_pre(bpe["pre"])
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        if bpe and bpe["special"].merges:
            writer.add_token_merges(bpe["special"].merges)
        if tok.bos_id >= 0:
            writer.add_bos_token_id(tok.bos_id)
        writer.add_eos_token_id(tok.eos_id)
        if tok.unk_id >= 0:
            writer.add_unk_token_id(tok.unk_id)
        if tok.pad_id >= 0:
            writer.add_pad_token_id(tok.pad_id)
        writer.add_add_bos_token(src.add_bos)
        writer.add_add_eos_token(False)
        if tok.chat_template:
            writer.add_chat_template(tok.chat_template)
        writer.add_string("trilm.family", cfg.family)
        writer.add_string("trilm.source", src.label)
        writer.add_uint32("trilm.scale_partitions", cfg.scale_partitions(1) if cfg.family != "floatlm" else 1)
        writer.add_array("trilm.folded_scales", folded or [""])
        writer.add_array("trilm.fallback_tensors", sorted(moved) or [""])
        for gname, (array, kind) in plan.items():
            stored = stored_raw[gname] if gname in stored_raw else gguf.quants.quantize(array, kind)
            writer.add_tensor(gname, stored, raw_dtype=None if kind in (T.F32, T.F16) else kind)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        errors = verify_gguf(tmp, plan, exact=set(stored_raw))
        check_declared_shapes(tmp)
    return GGUFReport(
        Path(out), qtype, len(plan), folded, errors, Path(out).stat().st_size, len(blocks), moved
    )


def verify_gguf(
    path: Path, plan: dict[str, tuple[np.ndarray, Any]], exact: set[str] | None = None
) -> dict[str, float]:
    """Read the file back and compare every dequantized tensor with what was meant to be stored; the
    ``exact`` ones (a QuantLM's own blocks) must read back bit for bit as its dequantized weights."""
    # deferred for start-up time: loads gguf only when called
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFReader, quants

    reader = GGUFReader(path)
    seen = {t.name: t for t in reader.tensors}
    if set(seen) != set(plan):
        raise ConfigError(f"{path}: read back {sorted(set(seen) ^ set(plan))[:5]} differently from written")
    errors = {}
    for name, (array, kind) in plan.items():
        t = seen[name]
        if t.tensor_type != kind:
            raise ConfigError(f"{path}: {name} reads back as {t.tensor_type.name}, written as {kind.name}")
        got = quants.dequantize(t.data, t.tensor_type).reshape(array.shape).astype(np.float32)
        if exact is not None and name in exact:
            if not np.array_equal(got.view(np.uint32), array.view(np.uint32)):
                raise ConfigError(f"{path}: {name} does not read back bit for bit as the QuantLM's weights")
            errors[name] = 0.0
            continue
        want = _intended(array, kind)
        if not np.isfinite(got).all():
            bad = int((~np.isfinite(got)).sum())
            raise ConfigError(f"{path}: {name} reads back with {bad:,} non-finite value(s); not a valid file")
        err = float(np.abs(got - want).max()) if got.size else 0.0
        bound = 0.0 if kind != T.Q8_0 else float(np.abs(array).max()) / 127.0
        if not err <= bound:  # NaN compares False: it must fail, not pass
            raise ConfigError(f"{path}: {name} reads back with error {err:.3g} (allowed {bound:.3g})")
        errors[name] = err
    return errors


def on_grid_type(src: ModelDir) -> str | None:
    """The llama.cpp type every block linear of a QuantLM is on (None: a float model, or no one type)."""

    packed = src.weights.packed_layers()
    found = {ggml_type_of(w)[0] for w in packed.values()}
    return found.pop() if len(found) == 1 and None not in found else None


def exact_blocks(src: ModelDir, qtype: str) -> dict[str, torch.Tensor]:
    """Canonical weight name → llama.cpp block bytes (uint8 rows) for a QuantLM on ``qtype``'s grid.

    A float model gets {} (its weights are quantized by llama.cpp's rounding); for Q4_0/Q4_1 a QuantLM
    with a layer off the grid is refused by layer name and reason; for Q8_0 it is re-quantized from
    its dequantized weights unless every layer is on Q8_0's grid."""

    packed = src.weights.packed_layers()
    if qtype not in GGML_TYPES or not packed:
        return {}
    off = {k: grid for k, w in packed.items() if (grid := ggml_type_of(w))[0] != qtype}
    if off and qtype == "q8_0":
        return {}
    if off:
        key, (found, why) = next(iter(off.items()))
        reason = f"it is on {found}'s grid" if found else why
        raise ConfigError(
            f"{src.given}: --type {qtype}: {gguf_name(key + '.weight')} ({len(off)} of {len(packed)} layers) "
            f"is not on llama.cpp's {qtype.upper()} grid: {reason}; re-quantizing a QuantLM would change it "
            f"(quantize with --target gguf-{qtype}, or export --type f16/q8_0)"
        )
    return {f"{k}.weight": torch.from_numpy(ggml_blocks(w, qtype)) for k, w in packed.items()}


def check_fp16_range(where, name: str, array: np.ndarray, kind) -> None:
    """Refuse a tensor whose stored fp16 values or fp16 block scales would overflow to ±inf."""
    # deferred for start-up time: loads gguf only when called
    from gguf import GGMLQuantizationType as T

    if kind == T.F32 or not array.size:
        return
    top = float(np.abs(array).max())
    limit = FP16_MAX * 127.0 if kind == T.Q8_0 else FP16_MAX  # Q8_0 stores max/127 as its fp16 scale
    if not top <= limit:
        raise ConfigError(
            f"{where}: {name} holds a weight of magnitude {top:.4g}, beyond what {kind.name} can store "
            f"(fp16 overflows past {FP16_MAX:g}{' × 127' if kind == T.Q8_0 else ''}); export it in another "
            "type or fix the weight"
        )
