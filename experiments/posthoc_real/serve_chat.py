"""A real QuantLM behind ``trilm serve``: SmolLM2-135M (quantized by :mod:`experiments.posthoc_real.run`)
answers chat turns on ``/v1/chat/completions``, its own chat template applied by the server.

    python -m experiments.posthoc_real.serve_chat --model data_cache/posthoc-real/models/gptq-w4

It starts ``trilm serve`` on a free loopback port, waits for ``/health``, sends each turn with greedy
decoding, and stops the server. The requests and replies, with the time each took, go to
``docs/results/posthoc-real/serve-chat.json``: the evidence that a real model's chat is served, not a test
(``tests/serve`` checks the template and the protocol on small local models).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

from benchmarks.common import CHECKOUT, write_result
from benchmarks.serve._process import Server

ROOT = CHECKOUT
TURNS = (
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France? Answer in one sentence."},
    ],
    [{"role": "user", "content": "Name three primary colours."}],
)


def post(url: str, body: dict, timeout: float) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a trilm model directory (QuantLM, import, pruned)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the server")
    parser.add_argument(
        "--packed", action="store_true", help="serve TriLM/BiLM latent weights packed (trilm serve --packed)"
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "posthoc-real" / "serve-chat.json"))
    args = parser.parse_args(argv)
    model = Path(args.model)
    name = f"smollm2-{model.name}"
    options = ["--device", "cpu", "--threads", str(args.threads), "--model-name", name]
    options += ["--packed"] if args.packed else []
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    server = Server(model, options, model.parent / f"{model.name}.serve.log", env=env)
    exchanges = []
    try:
        server.wait_ready(args.timeout)
        for messages in TURNS:
            body = {"model": name, "messages": messages, "max_tokens": args.max_tokens, "temperature": 0}
            start = time.perf_counter()
            reply = post(f"{server.url}/v1/chat/completions", body, timeout=args.timeout)
            exchanges.append({"request": body, "reply": reply, "seconds": time.perf_counter() - start})
            print(f"{messages[-1]['content']}\n  -> {reply['choices'][0]['message']['content']}")
    finally:
        server.stop()
    command = "trilm " + " ".join(server.command[3:]).replace(str(ROOT) + "/", "")
    write_result(
        args.out, {"server": command, "exchanges": exchanges}, module=__spec__.name, argv=argv, indent=2
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
