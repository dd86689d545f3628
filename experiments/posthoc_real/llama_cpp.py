"""A real model's GGUF in llama.cpp: SmolLM2-135M (a trilm QuantLM or the float import) exported by trilm,
loaded by llama.cpp (llama-cpp-python, the ``bench`` extra), logits and tokens compared with trilm's.

    python -m experiments.posthoc_real.llama_cpp --model data_cache/posthoc-real/models/gptq-w3 --type f16

What is compared, on the held-out text of :mod:`experiments.posthoc_real.run` (its first ``--tokens`` tokens):

- logits: llama.cpp's ``Llama.eval`` scores against trilm's inference model of the same directory (the
  QuantLM through its packed kernels), max |Δ| relative to the largest logit, and the top-1 agreement;
- tokenization: llama.cpp's ``tokenize`` of probe texts against the model's own tokenizer (transformers');
- generation: the greedy reply of both to one chat turn rendered with the model's chat template.

Writes ``docs/results/posthoc-real/llama-cpp.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.common import CHECKOUT, write_result

ROOT = CHECKOUT
PROBES = (
    "The quick brown fox jumps over the lazy dog.",
    "In the beginning God created the heaven and the earth.",
    "def f(x):\n    return x ** 2  # squares 12345\n",
    "naïve café, 漢字 and 🙂",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a trilm model directory of SmolLM2 (QuantLM, import)")
    parser.add_argument("--type", default="f16", choices=["f16", "q8_0", "tq2_0", "tq1_0"])
    parser.add_argument(
        "--fallback",
        default=None,
        choices=["f16", "q8_0"],
        help="with tq2_0/tq1_0: the type of tensors whose rows TQ blocks cannot hold (SmolLM2's 576)",
    )
    parser.add_argument(
        "--tokenizer-pre", default=None, help="llama.cpp pre-tokenizer name when the model has none recorded"
    )
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--gen", type=int, default=24)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "posthoc-real" / "llama-cpp.json"))
    args = parser.parse_args(argv)
    import llama_cpp
    import numpy as np
    import torch

    from trilm.data.text_source import token_stream
    from trilm.eval.model import load_eval_model
    from trilm.export.gguf import export_snapshot_gguf

    torch.set_num_threads(args.threads)
    model = Path(args.model)
    gguf = model.parent / f"{model.name}.{args.type}.gguf"
    start = time.perf_counter()
    report = export_snapshot_gguf(
        model, gguf, qtype=args.type, fallback=args.fallback, tokenizer_pre=args.tokenizer_pre
    )
    export_s = time.perf_counter() - start
    em = load_eval_model(model)
    tok = em.tokenizer
    ids = token_stream(ROOT / "trilm" / "data" / "corpus", tok, split="validation", max_tokens=args.tokens)
    ids = [em.prefix_token_id, *ids.tolist()]
    llm = llama_cpp.Llama(
        model_path=str(gguf), n_ctx=args.tokens + 64, logits_all=True, verbose=False, n_threads=args.threads
    )
    llm.eval(ids)
    theirs = torch.tensor(np.array(llm.scores[: len(ids)]))[:, : em.cfg.vocab_size]
    ours = em.logits(torch.tensor([ids]))[0, :, : em.cfg.vocab_size]
    delta = float((ours - theirs).abs().max())
    top1 = float((ours.argmax(-1) == theirs.argmax(-1)).float().mean())
    nll = {
        name: float(-torch.log_softmax(x[:-1].double(), -1).gather(-1, torch.tensor(ids[1:])[:, None]).mean())
        for name, x in (("trilm", ours), ("llama.cpp", theirs))
    }
    tokens = {}
    for text in PROBES:
        mine = tok.encode(text)
        cpp = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        tokens[text] = {"equal": mine == cpp, "trilm": mine, "llama.cpp": cpp}
    turn = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.encode(tok.render_chat(turn))
    llm.reset()
    cpp_reply = []
    for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        if token == tok.eos_id or len(cpp_reply) >= args.gen:
            break
        cpp_reply.append(int(token))
    seq = list(prompt)
    for _ in range(args.gen):
        nxt = int(em.logits(torch.tensor([seq]))[0, -1, : em.cfg.vocab_size].argmax())
        if nxt == tok.eos_id:
            break
        seq.append(nxt)
    trilm_reply = seq[len(prompt) :]
    result = {
        "model": str(model.name),
        "gguf": {
            "type": args.type,
            "fallback": {name: kind for name, kind in sorted(report.fallback.items())},
            "bytes": report.bytes,
            "export_s": export_s,
            "summary": report.summary(),
        },
        "llama_cpp_python": llama_cpp.__version__,
        "tokens_compared": len(ids),
        "logits": {"max_abs_delta": delta, "max_abs_logit": float(ours.abs().max()), "top1_agreement": top1},
        "mean_nll": nll,
        "tokenization": {"all_equal": all(v["equal"] for v in tokens.values()), "probes": tokens},
        "chat": {
            "prompt": tok.render_chat(turn),
            "trilm": tok.decode(trilm_reply),
            "llama.cpp": tok.decode(cpp_reply),
            "same_tokens": trilm_reply == cpp_reply,
        },
    }
    out = write_result(args.out, result, module=__spec__.name, argv=argv, indent=2)
    print(json.dumps({k: result[k] for k in ("logits", "mean_nll", "chat")}, indent=2, ensure_ascii=False))
    print(f"tokenization equal on {len(PROBES)} probes: {result['tokenization']['all_equal']}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
