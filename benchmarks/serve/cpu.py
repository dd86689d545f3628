"""trilm's engine against llama.cpp on the same CPU and the same weights, side by side in one run.

    python -m benchmarks.serve.cpu --out benchmarks/results          # tiny and 190m, 1 and 2 threads
    python -m benchmarks.serve.cpu --models tiny --threads 1 --rounds 3      # quick look

Weights: per model size a FloatLM and a TriLM snapshot with random weights (fan-in scaled; the TriLM's latent
weights become ternary through its own quantizer) and a small SentencePiece tokenizer, written once under
``--workdir``. llama.cpp reads the same snapshots through trilm's GGUF export (FloatLM: F16 and Q8_0; TriLM:
TQ2_0 and TQ1_0), through ``llama-cpp-python`` (the optional ``bench`` extra; without it the llama.cpp
rows are skipped with a message).

Contenders, all at batch 1 (``max_batch=1``):

* trilm FloatLM: fp32 eager, fp32 compiled, bf16 eager with plain ``nn.Linear`` layers, bf16 eager and
  bf16 compiled (``torch.compile``d steps, :mod:`trilm.serve.compiled`) with the float linears prepacked
  for oneDNN (:mod:`trilm.kernels.cpu_dense`, the default in bf16 on CPU);
* trilm TriLM: dequantized fp32 eager (the float image γ·Ŵ, the issue's baseline), dequantized bf16 compiled,
  packed bf16 eager and compiled (torch's int4 CPU kernel, :mod:`trilm.kernels.cpu`);
* llama.cpp: F16, Q8_0 (FloatLM GGUF), TQ2_0, TQ1_0 (TriLM GGUF).

Cases: **decode** tokens/s — one sequence after a 32-token prompt, ``--steps`` engine steps (trilm:
``Engine.step``, sampling included; llama.cpp: ``eval([token])`` plus an argmax over its logits);
**prefill** tokens/s — a ``--prompt`` token prompt through the model into an empty cache (trilm: the
engine's prefill path without sampling; llama.cpp: ``eval(prompt)`` after ``reset``). Rounds alternate the
contenders, so machine noise hits all alike; the median round counts. Each thread count runs in its own
process (inductor bakes the thread count into compiled code). Targets of issue 24 (1 thread, decode) are
evaluated and printed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import CHECKOUT, today, write_result
from trilm.model import preset
from trilm.model.config import ModelConfig

MODELS = {
    "tiny": dict(size="small", layers=4),  # hidden 256, ffn 768, 8 heads, 4 layers, vocab 4096
    "190m": dict(size="190m"),
}
DECODE_PROMPT = 32
LLAMA_TYPES = {"floatlm": ("f16", "q8_0"), "trilm": ("tq2_0", "tq1_0")}


# -- weights -----------------------------------------------------------------------------------------------
def model_config(model: str, family: str) -> ModelConfig:
    spec = dict(MODELS[model])
    return preset(f"{family}-{spec.pop('size')}", **spec)


def write_snapshots(workdir: Path, model: str) -> dict[str, Path]:
    """FloatLM and TriLM snapshots with random weights and a tokenizer (written once, then reused)."""
    from trilm.model.snapshot import SnapshotMeta
    from trilm.model.spec import canonical_shapes
    from trilm.store.snapshot import write_snapshot

    tokenizer = _tokenizer(workdir)
    out = {}
    for family in ("floatlm", "trilm"):
        cfg = model_config(model, family)
        directory = workdir / f"{model}-{family}"
        out[family] = directory
        if (directory / "COMPLETE").is_file():
            continue
        gen = torch.Generator().manual_seed(0)
        state = {}
        for name, shape in canonical_shapes(cfg).items():
            if len(shape) == 1:
                state[name] = torch.ones(shape)
            else:
                scale = 1.0 if name == "embed.weight" else shape[1] ** -0.5
                state[name] = torch.randn(shape, generator=gen) * scale
        meta = SnapshotMeta(family=family, size=cfg.size_name, tokenizer_hash=tokenizer.hash)
        write_snapshot(directory, cfg, meta, state, tokenizer=tokenizer.path, replace=True)
    return out


def _tokenizer(workdir: Path):
    from trilm.data import embedded_corpus_dir
    from trilm.data.slimpajama import read_documents
    from trilm.data.tokenizer import Tokenizer, train_tokenizer

    path = workdir / "tokenizer.model"
    if path.is_file():
        return Tokenizer.load(path)
    files = sorted(embedded_corpus_dir().glob("test/chunk*/*.jsonl.zst"))
    docs = list(itertools.islice((d.text for f in files for d in read_documents(f)), 64))
    workdir.mkdir(parents=True, exist_ok=True)
    return train_tokenizer(docs, path, vocab_size=512, num_threads=1, character_coverage=0.995)


def write_ggufs(snapshots: dict[str, Path], workdir: Path, model: str) -> dict[str, Path]:
    from trilm.export.gguf import export_snapshot_gguf

    out = {}
    for family, types in LLAMA_TYPES.items():
        for qtype in types:
            path = workdir / f"{model}-{family}-{qtype}.gguf"
            if not path.is_file():
                report = export_snapshot_gguf(snapshots[family], path, qtype=qtype)
                print(f"  wrote {path.name}: {report.bytes / 1e6:.1f} MB", file=sys.stderr)
            out[qtype] = path
    return out


# -- contenders --------------------------------------------------------------------------------------------
class TrilmContender:
    def __init__(
        self, name: str, snapshot: Path, *, dtype, packed: bool, compile: bool, prepack: bool, max_len: int
    ):
        from trilm.serve import Engine

        self.name = name
        self.engine = Engine.load(
            snapshot,
            device="cpu",
            dtype=dtype,
            packed=packed,
            prepack=prepack,
            max_batch=1,
            max_seq_len=max_len,
            compile=compile,
        )

    def prefill(self, prompt: list[int]) -> float:
        e = self.engine
        t = time.perf_counter()
        with torch.no_grad():
            if e.compiled is not None:
                e.compiled.prefill(prompt, 0)
            else:
                tokens = torch.tensor([prompt])
                e.model.forward_cached(tokens, len(prompt), e.cache.prefill(0, len(prompt)), last_only=True)
        return len(prompt) / (time.perf_counter() - t)

    def decode(self, prompt: list[int], steps: int) -> float:
        from trilm.serve import SamplingParams

        e = self.engine
        handle = e.submit(prompt, SamplingParams(temperature=0, max_tokens=steps + 2, ignore_eos=True))
        e.step()  # prefill, first token and the first decode step: untimed
        t = time.perf_counter()
        for _ in range(steps):
            e.step()
        rate = steps / (time.perf_counter() - t)
        handle.cancel()
        e.step()
        return rate

    def warm(self, prompt: list[int], steps: int) -> None:
        if self.engine.compiled is not None:
            self.engine.compiled.warm()
        self.prefill(prompt)
        self.decode(prompt[:DECODE_PROMPT], 2)


class LlamaContender:
    def __init__(self, name: str, path: Path, threads: int, max_len: int):
        from llama_cpp import Llama

        self.name = name
        self.llm = Llama(
            model_path=str(path),
            n_ctx=max_len,
            n_batch=max_len,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )

    def prefill(self, prompt: list[int]) -> float:
        self.llm.reset()
        t = time.perf_counter()
        self.llm.eval(prompt)
        return len(prompt) / (time.perf_counter() - t)

    def decode(self, prompt: list[int], steps: int) -> float:
        import numpy as np

        llm = self.llm
        llm.reset()
        llm.eval(prompt)
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        t = time.perf_counter()
        for _ in range(steps):
            llm.eval([token])
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        return steps / (time.perf_counter() - t)

    def warm(self, prompt: list[int], steps: int) -> None:
        self.prefill(prompt)
        self.decode(prompt[:DECODE_PROMPT], 2)


def contenders(model: str, snapshots, ggufs, threads: int, max_len: int, only: str | None = None) -> list:
    bf16, fp32 = torch.bfloat16, torch.float32
    f, t = snapshots["floatlm"], snapshots["trilm"]
    specs = [  # (name, snapshot, dtype, packed, compile, prepack)
        ("trilm floatlm fp32 eager", f, fp32, False, False, True),
        ("trilm floatlm fp32 compiled", f, fp32, False, True, True),
        ("trilm floatlm bf16 eager plain-linears", f, bf16, False, False, False),
        ("trilm floatlm bf16 eager", f, bf16, False, False, True),
        ("trilm floatlm bf16 compiled", f, bf16, False, True, True),
        ("trilm trilm dequantized fp32 eager", t, fp32, False, False, True),
        ("trilm trilm dequantized bf16 compiled", t, bf16, False, True, True),
        ("trilm trilm packed bf16 eager", t, bf16, True, False, True),
        ("trilm trilm packed bf16 compiled", t, bf16, True, True, True),
    ]
    out: list = [
        TrilmContender(name, path, dtype=dtype, packed=packed, compile=comp, prepack=pre, max_len=max_len)
        for name, path, dtype, packed, comp, pre in specs
        if only is None or only in name
    ]
    out += [
        LlamaContender(f"llama.cpp {q.upper()}", p, threads, max_len)
        for q, p in ggufs.items()
        if only is None or only in f"llama.cpp {q.upper()}"
    ]
    return out


# -- one thread count, in its own process ------------------------------------------------------------------
def measure(args, threads: int) -> list[dict]:
    torch.set_num_threads(threads)
    rows = []
    for model in args.models.split(","):
        workdir = args.workdir
        snapshots = write_snapshots(workdir, model)
        ggufs = write_ggufs(snapshots, workdir, model) if llama_available() and not args.no_llama else {}
        cfg = model_config(model, "floatlm")
        max_len = min(cfg.context, max(args.prompt, DECODE_PROMPT + args.steps * 2) + 16)
        gen = torch.Generator().manual_seed(1)
        prompt = torch.randint(3, 500, (args.prompt,), generator=gen).tolist()
        pool = contenders(model, snapshots, ggufs, threads, max_len, args.only)
        for c in pool:
            t0 = time.perf_counter()
            c.warm(prompt, args.steps)
            print(
                f"  [{model} t{threads}] warmed {c.name} in {time.perf_counter() - t0:.0f} s", file=sys.stderr
            )
        decode = {c.name: [] for c in pool}
        prefill = {c.name: [] for c in pool}
        for r in range(args.rounds):
            for c in pool if r % 2 == 0 else pool[::-1]:
                prefill[c.name].append(c.prefill(prompt))
                decode[c.name].append(c.decode(prompt[:DECODE_PROMPT], args.steps))
        for c in pool:
            rows.append(
                {
                    "model": model,
                    "threads": threads,
                    "contender": c.name,
                    "decode_tok_s": round(statistics.median(decode[c.name]), 1),
                    "prefill_tok_s": round(statistics.median(prefill[c.name]), 1),
                    "decode_rounds": [round(v, 1) for v in decode[c.name]],
                    "prefill_rounds": [round(v, 1) for v in prefill[c.name]],
                }
            )
            print(
                f"  [{model} t{threads}] {c.name:40s} decode {rows[-1]['decode_tok_s']:9.1f} tok/s   "
                f"prefill {rows[-1]['prefill_tok_s']:9.1f} tok/s",
                file=sys.stderr,
            )
        del pool
    return rows


def llama_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


# -- ratios and targets ------------------------------------------------------------------------------------
def rate(rows, model, threads, name, key="decode_tok_s"):
    for r in rows:
        if r["model"] == model and r["threads"] == threads and r["contender"] == name:
            return r[key]
    return None


def targets(rows: list[dict]) -> list[dict]:
    """Issue 24's targets (1 thread, decode) with the measured ratio; None where a side was not measured."""
    out = []

    def check(label, model, num, den, goal):
        a, b = rate(rows, model, 1, num), rate(rows, model, 1, den)
        ratio = None if a is None or b is None else round(a / b, 3)
        out.append({"target": label, "numerator": num, "denominator": den, "goal": goal, "ratio": ratio,
                    "met": None if ratio is None else ratio >= goal})  # fmt: skip

    best_float = "trilm floatlm bf16 compiled"
    packed = "trilm trilm packed bf16 compiled"
    check("190m FloatLM >= 0.7x llama.cpp F16", "190m", best_float, "llama.cpp F16", 0.7)
    check(
        "190m FloatLM (fp32) >= 0.7x llama.cpp F16",
        "190m",
        "trilm floatlm fp32 compiled",
        "llama.cpp F16",
        0.7,
    )
    check("190m TriLM packed >= 0.5x llama.cpp TQ2_0", "190m", packed, "llama.cpp TQ2_0", 0.5)
    check("190m TriLM packed >= 2x trilm FloatLM (bf16)", "190m", packed, best_float, 2.0)
    check("190m TriLM packed >= 2x trilm FloatLM (fp32)", "190m", packed, "trilm floatlm fp32 compiled", 2.0)
    check(
        "190m packing never slower than not (bf16)",
        "190m",
        packed,
        "trilm trilm dequantized bf16 compiled",
        1.0,
    )
    check("tiny FloatLM >= 0.5x llama.cpp F16", "tiny", best_float, "llama.cpp F16", 0.5)
    check(
        "tiny FloatLM (fp32) >= 0.5x llama.cpp F16",
        "tiny",
        "trilm floatlm fp32 compiled",
        "llama.cpp F16",
        0.5,
    )
    check("tiny TriLM packed >= 0.5x llama.cpp TQ2_0", "tiny", packed, "llama.cpp TQ2_0", 0.5)
    return out


def markdown(result: dict) -> str:
    """The result as markdown tables: tokens/s per contender (1 and 2 threads) and the targets."""
    lines = []
    for model in result["models"]:
        rows = [r for r in result["rows"] if r["model"] == model]
        threads = sorted({r["threads"] for r in rows})
        names = list(dict.fromkeys(r["contender"] for r in rows))
        head = " | ".join(f"decode t{t} | prefill t{t}" for t in threads)
        lines += [
            f"**{model}** (tokens/s)",
            "",
            f"| contender | {head} |",
            "|---|" + "---|" * 2 * len(threads),
        ]
        for name in names:
            cells = []
            for t in threads:
                cells += [
                    f"{rate(rows, model, t, name):,.0f}",
                    f"{rate(rows, model, t, name, 'prefill_tok_s'):,.0f}",
                ]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["| target (1 thread, decode) | ratio | met |", "|---|---|---|"]
    for t in result["targets"]:
        met = "not measured" if t["ratio"] is None else ("yes" if t["met"] else "no")
        lines.append(f"| {t['target']} | {t['ratio']} | {met} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,190m", help=f"comma list of {', '.join(MODELS)}")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--steps", type=int, default=32, help="decode steps per round")
    parser.add_argument("--prompt", type=int, default=128, help="prefill prompt tokens")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default=None, help="run only contenders whose name contains this")
    parser.add_argument("--no-llama", action="store_true", help="skip llama.cpp (and the GGUF exports)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "trilm-cpu-serve")
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON result")
    parser.add_argument("--one-thread-count", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--markdown", type=Path, default=None, help="print a result JSON as markdown tables")
    parser.add_argument(
        "--conditions",
        default=None,
        help="how the machine was prepared (pinning, paused jobs): kept in the JSON",
    )
    args = parser.parse_args(argv)
    if args.markdown is not None:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    if args.one_thread_count is not None:
        print(json.dumps(measure(args, args.one_thread_count)))
        return 0
    if not llama_available():
        print("llama-cpp-python is not installed (pip install '.[bench]'): llama.cpp rows are skipped")
    rows: list[dict] = []
    load_before = list(os.getloadavg())
    base, skip = [], False
    for a in argv if argv is not None else sys.argv[1:]:  # the child writes no file: drop --out and its value
        if skip or a.startswith("--out="):
            skip = False
            continue
        if a == "--out":
            skip = True
            continue
        base.append(a)
    for threads in (int(t) for t in args.threads.split(",")):
        cmd = [sys.executable, "-m", __spec__.name, *base, "--one-thread-count", str(threads)]
        print(f"threads={threads}: {' '.join(cmd[1:])}", flush=True)
        proc = subprocess.run(  # progress on stderr
            cmd, stdout=subprocess.PIPE, text=True, check=True, cwd=CHECKOUT
        )
        rows += json.loads(proc.stdout.strip().splitlines()[-1])
    result = {
        "benchmark": "cpu_serve",
        "conditions": args.conditions,
        "load_average_before": load_before,
        "llama_cpp": _llama_version(),
        "models": {m: _describe(m) for m in args.models.split(",")},
        "rows": rows,
        "targets": targets(rows),
    }
    print("\ntargets (1 thread, decode):")
    for t in result["targets"]:
        verdict = "not measured" if t["ratio"] is None else ("met" if t["met"] else "MISSED")
        print(f"  {t['target']:50s} {t['ratio']}  {verdict}")
    if args.out is not None and str(args.out) != os.devnull:
        path = args.out / f"cpu-serve-{today()}-t{args.threads.replace(',', '-')}.json"
        write_result(path, result, module=__spec__.name, argv=argv)
        print(f"wrote {path}")
    return 0


def _describe(model: str) -> dict:
    from trilm.model.flops import parameter_counts

    cfg = model_config(model, "floatlm")
    counts = parameter_counts(cfg)
    return {"hidden": cfg.hidden, "ffn": cfg.ffn, "heads": cfg.heads, "layers": cfg.layers,
            "vocab": cfg.padded_vocab, "parameters": counts.total}  # fmt: skip


def _llama_version() -> str | None:
    try:
        import llama_cpp
    except ImportError:
        return None
    return getattr(llama_cpp, "__version__", "unknown")


if __name__ == "__main__":
    sys.exit(main())
