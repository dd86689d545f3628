"""``trilm generate`` (text from a prompt) and ``trilm serve`` (the OpenAI-compatible server).

::

    trilm generate --model runs/quickstart/trilm-tiny/snapshots/step-120 --prompt "In the beginning"
    trilm serve --model runs/quickstart/trilm-tiny/snapshots/step-120 --port 8000
    TRILM_API_KEY=... trilm serve --model ... --host 0.0.0.0 --max-batch 16 --max-waiting 32

``--model`` is a snapshot, a packed snapshot (QuantLM, packed export) or a Hugging Face Llama directory; the
tokenizer is the snapshot's own (next to it, or in its run directory) unless ``--tokenizer`` names one.
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys
from pathlib import Path

from trilm.config import ConfigError
from trilm.dtypes import DTYPE_NAMES, parse_dtype
from trilm.serve import Engine, RequestError, SamplingError, SamplingParams
from trilm.serve.admission import Limits
from trilm.serve.loading import configure_threads, resolve_device

DTYPES = ("auto", *DTYPE_NAMES)
BACKENDS = ("auto", "triton", "cpu", "torch")


COMMANDS = ("generate", "serve")
DEFAULT_REQUEST_TIMEOUT = 600.0


def build_parser(parser: argparse.ArgumentParser, command: str = "generate") -> None:
    if command not in COMMANDS:
        raise ValueError(f"trilm.serve.cli builds {COMMANDS}, not {command!r}")
    parser.set_defaults(command=command)
    parser.add_argument("--model", required=True, help="snapshot, packed snapshot or HF Llama directory")
    parser.add_argument("--tokenizer", default=None, help="tokenizer.model or tokenizer.json (default: own)")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if available)")
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help="auto: bf16 on CUDA, fp32 on CPU (bf16 with --packed: torch's int4 CPU kernel is bf16-only)",
    )
    parser.add_argument(
        "--packed",
        action="store_true",
        help="serve TriLM/BiLM latent weights as packed ternary/binary (refused for a float model)",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="packed layers: auto = triton on CUDA, cpu (torch's int4 kernel) on CPU; torch = reference",
    )
    parser.add_argument(
        "--max-seq-len", type=int, default=None, help="prompt + generation (default: context)"
    )
    parser.add_argument("--no-cuda-graphs", action="store_true", help="decode eagerly on CUDA")
    parser.add_argument(
        "--no-fuse",
        action="store_true",
        help="keep Q/K/V and gate/up as separate matrices (default: stacked)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for torch (default: the CPUs this process may use)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the prefill and decode steps (each batch bucket once, at start; on CUDA the "
        "compiled decode steps are captured as the CUDA graphs)",
    )
    if command == "serve":
        # deferred for start-up time: fastapi and pydantic (keeps `trilm serve --help` fast)
        from trilm.serve.auth import ENV_VAR

        parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--model-name", default=None, help="the model id clients send (default: dir name)"
        )
        parser.add_argument("--max-batch", type=int, default=32, help="sequences decoded together")
        parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
        team = parser.add_argument_group("running it for a team (docs/serving.md)")
        team.add_argument(
            "--api-key",
            action="append",
            default=[],
            metavar="KEY",
            help=f"accept this bearer key on /v1/* (repeatable; default: ${ENV_VAR}, comma-separated keys; "
            "a key on the command line is visible to other users in `ps`)",
        )
        team.add_argument(
            "--allow-unauthenticated",
            action="store_true",
            help="bind beyond loopback without an API key (refused otherwise)",
        )
        team.add_argument(
            "--max-waiting",
            type=int,
            default=None,
            metavar="N",
            help="requests that may wait for a slot; more are answered 429 (default: 2 x --max-batch)",
        )
        team.add_argument(
            "--max-waiting-tokens",
            type=int,
            default=None,
            metavar="N",
            help="prompt tokens the waiting requests may hold together; more: 429 (default: no budget)",
        )
        team.add_argument(
            "--request-timeout",
            type=float,
            default=DEFAULT_REQUEST_TIMEOUT,
            metavar="SECONDS",
            help="end a request this long after it arrived, waiting or running, freeing its slot "
            f"(default: {DEFAULT_REQUEST_TIMEOUT:g}; 0: never)",
        )
        return
    parser.add_argument("--prompt", action="append", required=True, help="repeat for a batch of prompts")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--no-stream", action="store_true", help="print when done instead of streaming")


def _engine(args, max_batch: int, need_tokenizer: bool, limits=None):

    threads = configure_threads(args.threads)
    device = resolve_device(args.device)  # --compile off CPU and CUDA is refused by the engine, by name
    dtype = None if args.dtype == "auto" else parse_dtype(args.dtype, "--dtype")
    engine = Engine.load(
        args.model,
        device=device,
        dtype=dtype,
        packed=args.packed,
        backend=args.backend,
        fuse=not args.no_fuse,
        tokenizer=args.tokenizer,
        max_batch=max_batch,
        max_seq_len=args.max_seq_len,
        cuda_graphs=False if args.no_cuda_graphs else None,
        compile=args.compile,
        limits=limits,
    )
    if engine.tokenizer is None and need_tokenizer:
        raise ConfigError(
            f"{args.model}: no tokenizer found (tokenizer.json or tokenizer.model next to the model, or in "
            "its run directory); pass --tokenizer"
        )
    for note in engine.notes:
        print(f"trilm {args.command}: {note}", file=sys.stderr)
    if device.type == "cpu":
        print(f"trilm {args.command}: {threads} CPU thread(s)", file=sys.stderr)
    return engine


def run(args) -> int:
    return _serve(args) if args.command == "serve" else _generate(args)


def _generate(args) -> int:

    try:
        params = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            stop=tuple(args.stop),
            ignore_eos=args.ignore_eos,
        )
    except SamplingError as exc:
        field, _, rest = str(exc).partition(":")
        raise ConfigError(f"--{field.replace('_', '-')}:{rest}") from None
    engine = _engine(args, max_batch=len(args.prompt), need_tokenizer=True)
    try:
        if len(args.prompt) == 1 and not args.no_stream:
            print(args.prompt[0], end="", flush=True)
            for delta in engine.stream(args.prompt[0], params):
                print(delta.text, end="", flush=True)
            print()
            return 0
        outs = engine.generate(args.prompt, params)
    except RequestError as exc:
        raise ConfigError(str(exc)) from None
    print("\n\n".join(prompt + out.text for prompt, out in zip(args.prompt, outs)))
    return 0


def _serve(args) -> int:
    # deferred for start-up time: fastapi and prometheus_client (keeps `trilm serve --help` fast)
    from trilm.serve.auth import resolve_keys
    from trilm.serve.server import serve

    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port: must be in 0..65535 (0: any free port), got {args.port}")
    keys = resolve_keys(args.api_key)
    _check_exposure(args, keys)
    limits = _limits(args)
    engine = _engine(args, max_batch=args.max_batch, need_tokenizer=False, limits=limits)
    if engine.tokenizer is None:
        print("trilm serve: no tokenizer found: only token-id prompts will work", file=sys.stderr)
    name = args.model_name or Path(args.model).resolve().name
    if engine.graphs is not None:
        count = engine.graphs.capture_all()
        print(f"captured {count} CUDA graphs of the decode step", file=sys.stderr)
    if engine.compiled is not None:
        count = engine.compiled.warm()
        if engine.compiled.failure is None:
            captured = len(engine.compiled._graphs) if engine.compiled.capture else 0
            graphs = f", captured as {captured} CUDA graphs" if captured else ""
            print(f"compiled the prefill step and {count} decode steps{graphs}", file=sys.stderr)
    waiting = "unbounded" if limits.max_waiting is None else limits.max_waiting
    budget = "" if limits.max_waiting_tokens is None else f" ({limits.max_waiting_tokens} prompt tokens)"
    timeout = "none" if limits.request_timeout is None else f"{limits.request_timeout:g} s"
    print(
        f"trilm serve: {engine.max_batch} slots, {waiting} waiting{budget}, request timeout {timeout}; "
        + (f"{len(keys)} API key(s) required on /v1" if keys else "no API key"),
        file=sys.stderr,
    )
    print(f"serving {name!r} on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    serve(engine, name, host=args.host, port=args.port, log_level=args.log_level, api_keys=keys)
    return 0


def _check_exposure(args, keys: list[str]) -> None:
    """Beyond loopback, a server without a key serves anyone who reaches the port: refused unless asked
    for by name; with keys, a reminder that plain HTTP carries them in clear."""
    # deferred for start-up time: fastapi and pydantic (keeps `trilm serve --help` fast)
    from trilm.serve.auth import ENV_VAR

    if ipaddress.ip_address(_resolve(args.host)).is_loopback:
        return
    where = f"{args.host}:{args.port}"
    if not keys:
        if not args.allow_unauthenticated:
            raise ConfigError(
                f"--host {args.host}: {where} is reachable beyond this machine and no API key is set; "
                f"give --api-key KEY (or ${ENV_VAR}), or --allow-unauthenticated to serve anyone who "
                "can reach it"
            )
        print(
            f"trilm serve: warning: serving {where} without authentication: anyone who can reach it "
            "can use it (--allow-unauthenticated)",
            file=sys.stderr,
        )
        return
    print(
        f"trilm serve: note: {where} speaks plain HTTP, so keys and prompts cross the network in clear; "
        "put a TLS proxy in front beyond a trusted network",
        file=sys.stderr,
    )


def _limits(args):

    if args.max_batch < 1:
        raise ConfigError(f"--max-batch: must be >= 1, got {args.max_batch}")
    waiting = 2 * args.max_batch if args.max_waiting is None else args.max_waiting
    if waiting < 0:
        raise ConfigError(f"--max-waiting: must be >= 0 (0: no request waits), got {waiting}")
    if args.max_waiting_tokens is not None and args.max_waiting_tokens < 1:
        raise ConfigError(f"--max-waiting-tokens: must be >= 1, got {args.max_waiting_tokens}")
    if args.request_timeout < 0:
        raise ConfigError(f"--request-timeout: must be >= 0 seconds (0: never), got {args.request_timeout}")
    return Limits(
        max_waiting=waiting,
        max_waiting_tokens=args.max_waiting_tokens,
        request_timeout=args.request_timeout or None,
    )


def _resolve(host: str) -> str:

    try:
        return socket.gethostbyname(host)
    except OSError:
        raise ConfigError(f"--host: cannot resolve {host!r}") from None
