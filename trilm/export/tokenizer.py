"""The tokenizer files of a Hugging Face export, and the BOS convention a model was trained with.

trilm tokenizes with SentencePiece and **trains without BOS**: each document is its tokens followed by EOS
(``trilm data prepare``; ``--add-bos`` is the opt-in exception, recorded in the split's ``index.json``).
Clients have to be told, or they prepend BOS and evaluate a model on inputs it never saw. An export
therefore carries:

- ``tokenizer.model``: the SentencePiece model itself (llama.cpp's converter and slow tokenizers read it);
- ``tokenizer.json``: the same tokenizer for the ``tokenizers`` library, built from the SentencePiece proto
  and checked to give the same ids as SentencePiece on probe texts before anything is written; BOS is added
  by its post-processor only when the model was trained with it;
- ``tokenizer_config.json``: ``PreTrainedTokenizerFast`` (loads ``tokenizer.json`` as written in
  transformers 4.x and 5.x alike), bos/eos/unk, ``add_bos_token`` as trained, ``add_eos_token`` false,
  ``model_max_length`` = the context, and ``split_special_tokens`` true: SentencePiece reads a literal
  ``</s>`` in text as text, and so did training;
- ``special_tokens_map.json``.

A model with a Hugging Face tokenizer (``tokenizer.json``: imported Llamas) exports that tokenizer's own
files, byte for byte.

Which tokenizer belongs to a model, and whether it was trained with BOS, is the store's policy
(:mod:`trilm.store.tokenizer`); this module writes the files.
"""

from __future__ import annotations

from pathlib import Path

from sentencepiece import sentencepiece_model_pb2

from trilm.atomic import copy_file, write_json
from trilm.config import ConfigError
from trilm.data.tokenizer import Tokenizer

PROBE_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "  two leading spaces,   three inside, trailing  ",
    "\n\nnew\nlines\tand\ttabs\r\n",
    "digits 1234567890 and 3.14159, 2025-01-01",
    "naïve café, 漢字, ☃ and 🙂 fall back to bytes",
    "def f(x):\n    return x ** 2  # code\n",
    "a literal </s> and <s> and <unk> are text",
    " ",
    "x",
)


def sentencepiece_proto(tok: Tokenizer):
    """The parsed ``ModelProto`` of a SentencePiece model file (pieces, scores, types, normalizer)."""

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(tok.path.read_bytes())
    return proto


def hf_tokenizer(tok: Tokenizer, add_bos: bool):
    """A ``tokenizers.Tokenizer`` equal to ``tok`` (verified on :data:`PROBE_TEXTS`), BOS as trained."""
    # deferred for start-up time: loads tokenizers and transformers only when called
    from tokenizers import AddedToken, processors
    from transformers.convert_slow_tokenizer import SpmConverter

    proto = sentencepiece_proto(tok)
    if proto.trainer_spec.model_type != 2:  # BPE
        raise ConfigError(f"{tok.path}: only SentencePiece BPE models are exported (trilm trains BPE)")
    vocab = {piece.piece: i for i, piece in enumerate(proto.pieces)}
    built = SpmConverter.build_tokenizer_from_spm_proto(proto, vocab)
    specials = [tok.sp.id_to_piece(i) for i in (tok.unk_id, tok.bos_id, tok.eos_id) if i >= 0]
    built.add_special_tokens([AddedToken(p, special=True, normalized=False) for p in specials])
    if add_bos:
        bos = tok.sp.id_to_piece(tok.bos_id)
        built.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.bos_id)]
        )
    verify_tokenizer(tok, built, add_bos)
    return built


def verify_tokenizer(tok: Tokenizer, built, add_bos: bool, texts=PROBE_TEXTS) -> None:
    """Raise if ``built`` (a ``tokenizers.Tokenizer``) encodes any text differently from SentencePiece.

    Special-token strings are read as text, as transformers does with ``split_special_tokens``.
    """
    bos = [tok.bos_id] if add_bos else []
    built.encode_special_tokens = True
    try:
        for text in texts:
            ours = bos + tok.encode(text)
            theirs = built.encode(text, add_special_tokens=True).ids
            if ours != theirs:
                raise ConfigError(
                    f"{tok.path}: the converted tokenizer.json encodes {text!r} as {theirs[:12]}…, "
                    f"SentencePiece as {ours[:12]}…; refusing to write a tokenizer that changes the ids"
                )
    finally:
        built.encode_special_tokens = False


def write_hf_tokenizer_files(tok, out_dir: Path, *, add_bos: bool, context: int) -> list[Path]:
    """A Hugging Face tokenizer's own files, copied as they are (transformers loads them as it loaded the
    originals); a lone ``tokenizer.json`` gets a ``tokenizer_config.json`` naming its special tokens."""
    written = [copy_file(source, out_dir / name) for name, source in tok.files.items()]
    if not (out_dir / "tokenizer_config.json").is_file():
        names = {
            f"{k}_token": tok.id_to_piece(i) if i >= 0 else None
            for k, i in (("bos", tok.bos_id), ("eos", tok.eos_id), ("unk", tok.unk_id), ("pad", tok.pad_id))
        }
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **names,
            "add_bos_token": add_bos,
            "model_max_length": context,
            "clean_up_tokenization_spaces": False,
            "trilm_tokenizer_hash": tok.hash,
        }
        if tok.chat_template:
            config["chat_template"] = tok.chat_template
        write_json(out_dir / "tokenizer_config.json", config)
        written.append(out_dir / "tokenizer_config.json")
    return written


def write_tokenizer_files(tok: Tokenizer, out_dir: str | Path, *, add_bos: bool, context: int) -> list[Path]:
    """Write the tokenizer files into ``out_dir`` (the four of the module docstring for SentencePiece; a
    Hugging Face tokenizer's own files for one); returns their paths."""
    out_dir = Path(out_dir)
    if tok.kind == "hf":
        return write_hf_tokenizer_files(tok, out_dir, add_bos=add_bos, context=context)
    built = hf_tokenizer(tok, add_bos)
    model = copy_file(tok.path, out_dir / "tokenizer.model")
    built.save(str(out_dir / "tokenizer.json"))
    names = {
        "bos_token": tok.sp.id_to_piece(tok.bos_id) if tok.bos_id >= 0 else None,
        "eos_token": tok.sp.id_to_piece(tok.eos_id),
        "unk_token": tok.sp.id_to_piece(tok.unk_id) if tok.unk_id >= 0 else None,
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **names,
        "pad_token": None,
        "add_bos_token": add_bos,
        "add_eos_token": False,
        "model_max_length": context,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": True,
        "padding_side": "left",
        "trilm_tokenizer_hash": tok.hash,
    }
    write_json(out_dir / "tokenizer_config.json", config)
    write_json(out_dir / "special_tokens_map.json", {k: v for k, v in names.items() if v is not None})
    return [
        model,
        out_dir / "tokenizer.json",
        out_dir / "tokenizer_config.json",
        out_dir / "special_tokens_map.json",
    ]
