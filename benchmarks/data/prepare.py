"""Tokens/s of the whole prepare path against raw SentencePiece encoding of the same text, same run.

Usage::

    python -m benchmarks.data                   # embedded train split, copied 3× (~8.7M tokens), 2 trials
    python -m benchmarks.data --copies 1 --trials 1 --json out.json

Measured side by side, best of ``--trials`` each (the machine may be shared):

* raw, 1 thread:  ``SentencePieceProcessor.encode(texts, num_threads=1)`` on texts already in memory;
* raw, 2 threads: the same with ``num_threads=2``;
* read only:      decompress + parse + checks of every file, no tokenizer (the reader's share);
* prepare, 1 and 2 workers: ``trilm.data.prepare`` from ``.jsonl.zst`` files to finished shards on disk
  (read, check, encode, EOS, write, fsync, checksums, index), fresh output directory each time.

Targets: prepare with W workers ≥ 0.8 × raw with W threads, i.e. ≥ 0.8× raw per worker; 2 workers ≈ 2× one.
Wall-clock ratios need otherwise idle cores. On a busy machine the CPU-time ratios give the per-worker cost:
``cpu_prepare_W_vs_raw_W`` = CPU seconds of raw encoding with W threads / CPU seconds of prepare with W
workers (parent and workers, process start-up included); ``task_cpu_...`` counts only the CPU the workers
spent on their files.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import write_result
from trilm.data import embedded_corpus_dir
from trilm.data.pipeline import TokenizerConfig
from trilm.data.prepare import PrepareConfig, prepare
from trilm.data.slimpajama import read_documents, split_files


def _corpus_copy(root: Path, copies: int) -> Path:
    """The embedded train split, its files repeated ``copies`` times as further chunks (same text)."""
    out = root / "corpus"
    for c in range(copies):
        for f in split_files(embedded_corpus_dir(), "train"):
            chunk, name = f.key.split("/")[1:]
            dest = out / "train" / f"chunk{c * 10 + int(chunk.removeprefix('chunk'))}" / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f.path, dest)
    return out


def _cpu() -> float:
    """CPU seconds of this process and its reaped children (the prepare workers)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def _best(fn, trials: int) -> tuple[float, float, object]:
    """(best wall seconds, CPU seconds of that trial, result)."""
    best, cpu, result = float("inf"), float("inf"), None
    for _ in range(trials):
        t0, c0 = time.perf_counter(), _cpu()
        result = fn()
        wall, used = time.perf_counter() - t0, _cpu() - c0
        if wall < best:
            best, cpu = wall, used
    return best, cpu, result


def _row(seconds: float, cpu: float, tokens: int) -> dict:
    return {"seconds": seconds, "cpu_seconds": cpu, "tokens": tokens, "tokens_per_s": tokens / seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="prepare path vs raw sentencepiece encode")
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    os.environ["TRILM_NO_PROGRESS"] = "1"
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus = _corpus_copy(root, args.copies)
        tok = TokenizerConfig(
            input=str(embedded_corpus_dir()), out=str(root / "tok"), vocab_size=args.vocab_size
        )
        tok = tok.build()
        files = split_files(corpus, "train")
        texts = [d.text for f in files for d in read_documents(f)]
        results: dict[str, dict] = {}

        def raw(threads: int):
            return sum(len(ids) + 1 for ids in tok.sp.encode(texts, num_threads=threads))

        for threads in (1, 2):
            seconds, cpu, tokens = _best(lambda t=threads: raw(t), args.trials)
            results[f"raw_{threads}"] = _row(seconds, cpu, tokens)
        seconds, cpu, docs = _best(lambda: sum(1 for f in files for _ in read_documents(f)), args.trials)
        results["read_only"] = {"seconds": seconds, "cpu_seconds": cpu, "documents": docs}
        for workers in (1, 2):

            def run(w=workers):
                out = root / f"out{w}"
                shutil.rmtree(out, ignore_errors=True)
                cfg = PrepareConfig(
                    input=str(corpus),
                    split="train",
                    tokenizer=str(tok.path),
                    out=str(out),
                    workers=w,
                    progress=False,
                )
                index = prepare(cfg)
                return index["num_tokens"], index["worker_cpu_seconds"]

            seconds, cpu, (tokens, task_cpu) = _best(run, args.trials)
            results[f"prepare_{workers}"] = {**_row(seconds, cpu, tokens), "task_cpu_seconds": task_cpu}
    assert results["prepare_1"]["tokens"] == results["raw_1"]["tokens"], "prepare and raw saw different text"
    r = results
    ratios = {  # wall clock: meaningful on otherwise idle cores
        "prepare_1_vs_raw_1": r["prepare_1"]["tokens_per_s"] / r["raw_1"]["tokens_per_s"],
        "prepare_2_vs_raw_2": r["prepare_2"]["tokens_per_s"] / r["raw_2"]["tokens_per_s"],
        "prepare_2_per_worker_vs_raw_1": r["prepare_2"]["tokens_per_s"] / 2 / r["raw_1"]["tokens_per_s"],
        "prepare_2_vs_prepare_1": r["prepare_2"]["tokens_per_s"] / r["prepare_1"]["tokens_per_s"],
        "read_share_of_raw_1": r["read_only"]["seconds"] / r["raw_1"]["seconds"],
        # CPU seconds of raw / of prepare at equal concurrency: per-worker cost, robust to a busy machine
        "cpu_prepare_1_vs_raw_1": r["raw_1"]["cpu_seconds"] / r["prepare_1"]["cpu_seconds"],
        "cpu_prepare_2_vs_raw_2": r["raw_2"]["cpu_seconds"] / r["prepare_2"]["cpu_seconds"],
        "task_cpu_prepare_2_vs_raw_2": r["raw_2"]["cpu_seconds"] / r["prepare_2"]["task_cpu_seconds"],
    }
    tokens = results["raw_1"]["tokens"]
    load = (load_before, os.getloadavg()[0])
    print(f"{len(texts)} documents, {tokens:,} tokens (vocab {tok.vocab_size}), {os.cpu_count()} CPUs, "
          f"best of {args.trials}, load average {load[0]:.1f} before, {load[1]:.1f} after")  # fmt: skip
    for name, row in results.items():
        rate = f"{row['tokens_per_s'] / 1e6:8.3f} M tok/s" if "tokens_per_s" in row else ""
        print(f"  {name:<12} {row['seconds']:8.3f} s wall {row['cpu_seconds']:8.3f} s CPU {rate}")
    for name, value in ratios.items():
        print(f"  {name:<32} {value:6.2f}")
    if args.json:
        result = {"results": results, "ratios": ratios, "load_average_before_after": load}
        write_result(args.json, result, module=__spec__.name, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
