"""``trilm data``: tokenizer training, tokenizing into shards, statistics, and looking at what a step reads.

Usage::

    trilm data tokenizer --input CORPUS --out TOK.model --vocab-size 4096
    trilm data prepare   --input CORPUS --split train --tokenizer TOK.model --out runs/data/train --workers 8
    trilm data stats     runs/data/train                 # prepared split: exact tokens per source
    trilm data stats     CORPUS --split validation       # raw files: documents and bytes per source
    trilm data inspect   runs/data/train --seq-len 256 --global-batch 8 --step 3 --tokenizer TOK.model
    trilm data embedded  --out runs/data                 # tokenizer + train/validation of the embedded corpus

CORPUS is a SlimPajama-shaped directory (default: the embedded corpus) or ``hf:cerebras/SlimPajama-627B``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from trilm.cli_options import add_no_progress
from trilm.config import ConfigError
from trilm.data import embedded_corpus_dir


def _weights(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            out[name] = float(value)
        except ValueError:
            raise ConfigError(f"--weight {item!r}: expected SOURCE=NUMBER") from None
        if not sep or not name:
            raise ConfigError(f"--weight {item!r}: expected SOURCE=NUMBER")
    return out


def build_parser(parser: argparse.ArgumentParser, command: str = "data") -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n\n", 1)[1]
    sub = parser.add_subparsers(dest="action", required=True)

    p = sub.add_parser("tokenizer", help="train a SentencePiece BPE tokenizer (byte fallback)")
    p.add_argument("--input", default="", help="corpus directory or hf:<repo> (default: embedded corpus)")
    p.add_argument("--split", default="train")
    p.add_argument("--out", required=True, help=".model path or a directory")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--max-files", type=int, default=0, help="use only the first N files (0: all)")
    p.add_argument("--max-sentences", type=int, default=2_000_000, help="lines sampled for training")
    p.add_argument("--exclude-source", action="append", default=[], metavar="NAME")
    p.add_argument("--seed", type=int, default=0)

    p = sub.add_parser("prepare", help="tokenize a split into packed token shards (resumable)")
    p.add_argument("--input", default="", help="corpus directory or hf:<repo> (default: embedded corpus)")
    p.add_argument("--split", default="train", choices=["train", "validation", "test"])
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--reader", default="zstd", choices=["zstd", "datasets"])
    p.add_argument(
        "--exclude-source", action="append", default=[], metavar="NAME", help="e.g. RedPajamaGithub"
    )
    p.add_argument("--include-source", action="append", default=[], metavar="NAME", help="keep only these")
    p.add_argument(
        "--weight", action="append", default=[], metavar="SOURCE=W", help="0 drops, 2 repeats twice"
    )
    p.add_argument("--skip-bad", action="store_true", help="count and skip bad input instead of failing")
    p.add_argument("--add-bos", action="store_true")
    p.add_argument("--max-files", type=int, default=0)
    add_no_progress(p)

    p = sub.add_parser("stats", help="per-source statistics of a prepared split or of raw files")
    p.add_argument(
        "path", nargs="?", default="", help="prepared split dir, or corpus dir (default: embedded)"
    )
    p.add_argument("--split", default="train", help="for a corpus directory")
    p.add_argument("--tokenizer", default="", help="for a corpus directory: also count tokens")
    p.add_argument("--skip-bad", action="store_true")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")

    p = sub.add_parser("inspect", help="print the documents and text of one training step")
    p.add_argument("path", help="prepared train split directory")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--global-batch", type=int, required=True)
    p.add_argument("--step", type=int, default=0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--tokenizer", default="", help="decode the text too")
    p.add_argument("--chars", type=int, default=200, help="characters of text shown per sample")

    p = sub.add_parser("embedded", help="tokenizer + prepared train/validation splits of the embedded corpus")
    p.add_argument("--out", required=True)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--workers", type=int, default=2)


def _corpus(path: str) -> str:
    if path:
        return path

    return str(embedded_corpus_dir())


def run(args: argparse.Namespace) -> int:
    return {
        "tokenizer": _run_tokenizer,
        "prepare": _run_prepare,
        "stats": _run_stats,
        "inspect": _run_inspect,
        "embedded": _run_embedded,
    }[args.action](args)


def _run_tokenizer(args) -> int:
    # deferred for start-up time: numpy and sentencepiece (keeps `trilm data --help` fast)
    from trilm.data.pipeline import TokenizerConfig

    cfg = TokenizerConfig(
        input=_corpus(args.input),
        out=args.out,
        split=args.split,
        vocab_size=args.vocab_size,
        max_files=args.max_files,
        max_sentences=args.max_sentences,
        exclude_sources=args.exclude_source,
        seed=args.seed,
    )
    tok = cfg.build()
    print(f"{tok.path}: vocab {tok.vocab_size} (padded 64: {tok.padded_vocab_size(64)}, 128: "
          f"{tok.padded_vocab_size(128)}), sha256 {tok.hash}")  # fmt: skip
    return 0


def _run_prepare(args) -> int:
    # deferred for start-up time: numpy and sentencepiece (keeps `trilm data --help` fast)
    from trilm.data.prepare import PrepareConfig, prepare

    cfg = PrepareConfig(
        input=_corpus(args.input),
        split=args.split,
        tokenizer=args.tokenizer,
        out=args.out,
        workers=args.workers,
        reader=args.reader,
        exclude_sources=args.exclude_source,
        include_sources=args.include_source,
        source_weights=_weights(args.weight),
        skip_bad=args.skip_bad,
        add_bos=args.add_bos,
        max_files=args.max_files,
        progress=not args.no_progress,
    )
    index = prepare(cfg)
    _print_table(index["tokens_per_source"], index["documents_per_source"])
    skipped = index["read"]["skipped"]
    print(f"{args.out}: {index['num_tokens']:,} tokens in {len(index['shards'])} shards "
          f"({index['resumed_shards']} kept from before), {index['seconds']:.1f}s, "
          f"fingerprint {index['fingerprint'][:16]}")  # fmt: skip
    if skipped:
        print(f"skipped input: {json.dumps(skipped)}; first: {json.dumps(index['read']['examples'])}")
    return 0


def _print_table(tokens: dict[str, int], docs: dict[str, int], extra: dict[str, int] | None = None) -> None:
    total = sum(tokens.values()) or 1
    print(f"{'source':<26} {'documents':>10} {'tokens':>14} {'share':>7}")
    for name in sorted(tokens, key=lambda k: -tokens[k]):
        print(f"{name:<26} {docs.get(name, 0):>10,} {tokens[name]:>14,} {tokens[name] / total:>7.1%}")
    print(f"{'total':<26} {sum(docs.values()):>10,} {sum(tokens.values()):>14,}")


def _skipped(index: dict) -> object:
    """What prepare skipped, as the split's ``index.json`` records it; None where it has no such record."""
    read = index.get("read")
    return read.get("skipped") if isinstance(read, dict) else None


def _run_stats(args) -> int:

    path = Path(_corpus(args.path))
    if (path / "index.json").is_file():
        # deferred for start-up time: numpy (keeps `trilm data --help` fast)
        from trilm.data.shards import TokenShards

        shards = TokenShards.open(path)
        index = shards.index
        if args.json:
            keep = ("num_tokens", "num_documents", "tokens_per_source", "documents_per_source", "fingerprint")
            print(json.dumps({k: index.get(k) for k in keep}, indent=1))
            return 0
        _print_table(index.get("tokens_per_source", {}), index.get("documents_per_source", {}))
        print(f"dtype {index['dtype']}, tokenizer {index['tokenizer_hash'][:16]}, fingerprint "
              f"{index['fingerprint'][:16]}, skipped {_skipped(index) or 'none'}")  # fmt: skip
        return 0
    # deferred for start-up time: zstandard (keeps `trilm data --help` fast)
    from trilm.data.slimpajama import source_statistics, split_files

    tok = None
    if args.tokenizer:
        # deferred for start-up time: sentencepiece (keeps `trilm data --help` fast)
        from trilm.data.tokenizer import Tokenizer

        tok = Tokenizer.load(args.tokenizer)
    table = source_statistics(split_files(path, args.split), skip_bad=args.skip_bad, tokenizer=tok)
    if args.json:
        print(json.dumps(table, indent=1))
        return 0
    print(f"{'source':<26} {'documents':>10} {'MB':>10}" + (f" {'tokens':>12}" if tok else ""))
    for name, row in table.items():
        line = f"{name:<26} {row['documents']:>10,} {row['bytes'] / 1e6:>10.2f}"
        print(line + (f" {row['tokens']:>12,}" if tok else ""))
    return 0


def _run_inspect(args) -> int:
    # deferred for start-up time: torch and numpy (keeps `trilm data --help` fast)
    from trilm.data.sampler import SequenceSampler

    # deferred for start-up time: numpy (keeps `trilm data --help` fast)
    from trilm.data.shards import TokenShards

    shards = TokenShards.open(args.path)
    sampler = SequenceSampler(shards, args.seq_len, args.seed)
    tok = None
    if args.tokenizer:
        # deferred for start-up time: sentencepiece (keeps `trilm data --help` fast)
        from trilm.data.tokenizer import Tokenizer

        tok = Tokenizer.load(args.tokenizer, expected_hash=shards.tokenizer_hash)
    first = args.step * args.global_batch
    indices = sampler.global_indices(first, args.global_batch)
    batch = sampler.samples(indices)
    print(f"step {args.step}: global samples {first}..{first + args.global_batch - 1}, "
          f"epoch {sampler.epoch(first)}, fingerprint {shards.fingerprint[:16]}")  # fmt: skip
    documents = sampler.documents_of(args.step, args.global_batch)
    for row, (seq, docs) in enumerate(zip(indices, documents)):
        g = first + row
        where = ", ".join(f"{d['shard']}#{d['document']} ({d['source']})" for d in docs)
        print(f"[{row}] sample {g} = sequence {seq}: {where}")
        if tok is not None:
            text = tok.decode(batch[row].tolist())[: args.chars]
            print("    " + text.replace("\n", "\n    "))
    return 0


def _run_embedded(args) -> int:
    # deferred for start-up time: numpy and sentencepiece (keeps `trilm data --help` fast)
    from trilm.data.pipeline import prepare_embedded

    paths = prepare_embedded(args.out, vocab_size=args.vocab_size, workers=args.workers)
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0
