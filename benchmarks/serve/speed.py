"""Serving speed, measured side by side in one run: time to first token, decode tokens/s, peak memory.

    python -m benchmarks.serve --out benchmarks/results                  # CPU (tiny model, 1 thread)
    python -m benchmarks.serve --size small --out benchmarks/results     # CPU, a larger shape
    python -m benchmarks.serve --device cuda --size 3.9b --out benchmarks/results   # the H200 targets

Contenders share one model shape and random weights (speed does not depend on the values): **FloatLM**
(float ``nn.Linear``), **TriLM** (packed ternary ``QuantLinear``) and **QuantLMs** (packed int4 / int2
g128, the GPTQ/OmniQuant grid format), all served by ``trilm.serve.Engine``; on CPU also transformers'
``LlamaForCausalLM.generate`` on the same FloatLM (built in memory from its tensors, in the engine's dtype
and device, no checkpoint written; sdpa attention, dynamic cache, greedy); on CUDA only with ``--hf``.

Cases: time to first token (prefill + first sample) of prompts of 128 / 512 / 2048 tokens at batch 1; decode
tokens/s at context depths 128 / 1024 and batch 1 / 8 / 32, as batch × steps / time of ``--steps`` decode
steps after the prompts are in the cache (for ``generate``: between its first and last new token, taken
from a streamer). Rounds alternate the contenders so machine noise hits all alike; the median round
counts. The context is extended to 2048 + 64 so that a 2048-token prompt leaves room to generate.

Memory: model bytes (parameters and packed buffers), the engine's KV-cache bytes, and the peak working
memory of the largest decode case (CUDA: ``max_memory_allocated`` above what was allocated before; CPU: the
rise of the process's peak RSS, reset through ``/proc/self/clear_refs``).

GPU targets (issue 12, H200): FloatLM-3.9B bf16 at batch 1 streams its weights at ≥ 60 % of the copy
bandwidth measured on the device in the same run; TriLM-3.9B packed reaches ≥ 3× the FloatLM's decode
tokens/s in the same engine. Both are computed and printed when run on CUDA; on CPU they are "not measured".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import CHECKOUT, today, write_result
from benchmarks.serve._report import markdown, print_table
from trilm.dtypes import DTYPE_NAMES, parse_dtype
from trilm.infer import InferenceModel, fuse_projections, prepare_for_inference
from trilm.model import preset
from trilm.serve import Engine, SamplingParams
from trilm.store.hf import hf_config_dict, hf_name

TTFT_LENGTHS = (128, 512, 2048)
DEPTHS = (128, 1024)
BATCHES = (1, 8, 32)
EXTRA_CONTEXT = 64


# -- contenders ---------------------------------------------------------------------------------------
def build_model(kind: str, cfg, device: torch.device, dtype: torch.dtype, seed: int = 0) -> InferenceModel:
    """The FloatLM with random weights, or the same shape with packed block linears of ``kind``."""
    from trilm.kernels import QuantLinear

    from trilm.formats import IntWeight, TernaryWeight

    torch.manual_seed(seed)
    with torch.device(device):
        model = InferenceModel(cfg)
    model = prepare_for_inference(model, device=device, dtype=dtype)
    if kind == "floatlm":
        return model
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, linear in list(model.linear_modules().items()):
        n, k = linear.weight.shape
        if kind == "trilm":
            codes = torch.randint(-1, 2, (n, k), generator=gen, device=device, dtype=torch.int8)
            scales = torch.full((1, n), 0.02, device=device)  # one scale per output row (per TP shard)
            packed = TernaryWeight.pack(codes, scales)
        elif kind.startswith("quantlm-int"):
            bits, g = int(kind.removeprefix("quantlm-int")), min(128, k)
            codes = torch.randint(0, 2**bits, (n, k), generator=gen, device=device, dtype=torch.uint8)
            scales = torch.full((k // g, n), 0.01, device=device)
            zeros = torch.full((k // g, n), 2 ** (bits - 1), device=device, dtype=torch.uint8)
            packed = IntWeight.pack(codes, scales, zeros, bits)
        else:
            raise ValueError(f"unknown contender {kind!r}")
        model.set_linear(name, QuantLinear(packed).to(device))
        del linear
    return model


def model_bytes(model: torch.nn.Module) -> int:
    tensors = [*model.parameters(), *(b for b in model.buffers() if b is not None)]
    skip = {id(model.rope_cos), id(model.rope_sin)}
    return sum(t.numel() * t.element_size() for t in tensors if id(t) not in skip)


def streamed_bytes(model: InferenceModel) -> int:
    """Weight bytes one decode step reads: everything but the embedding table (one row of it) and RoPE."""
    return model_bytes(model) - model.embed.weight.numel() * model.embed.weight.element_size()


# -- timing helpers -----------------------------------------------------------------------------------
def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def _prompts(vocab: int, length: int, count: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (count, length), generator=gen).tolist()


class EngineContender:
    """One model behind two engines: a one-slot engine as long as the longest prompt (time to first token)
    and a ``max(batches)``-slot engine as long as the decode cases need, so the KV cache of a 3.9B model
    is not 32 slots of the longest prompt."""

    def __init__(self, name: str, engine: Engine, ttft_engine: Engine):
        self.name, self.engine, self.ttft_engine = name, engine, ttft_engine
        self.device = engine.device

    def ttft(self, prompt: list[int]) -> float:
        engine = self.ttft_engine
        handle = engine.submit(prompt, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
        t = _now(self.device)
        while not handle.finished:
            engine.step()
        return _now(self.device) - t

    def start_decode(self, prompts: list[list[int]], steps: int, rounds: int) -> None:
        params = SamplingParams(temperature=0, max_tokens=steps * rounds + 8, ignore_eos=True)
        self.handles = [self.engine.submit(p, params) for p in prompts]
        self.engine.step()  # prefill all (untimed) and the first decode step
        if self.engine.num_running != len(prompts):
            raise RuntimeError(f"{self.name}: {self.engine.num_running} of {len(prompts)} running")

    def decode_round(self, steps: int) -> float:
        t = _now(self.device)
        for _ in range(steps):
            self.engine.step()
        return len(self.handles) * steps / (_now(self.device) - t)

    def end_decode(self) -> None:
        for h in self.handles:
            h.cancel()
        self.engine.step()


class HFContender:
    """transformers' ``generate`` on the FloatLM's weights; each round is one whole ``generate`` call.

    Built in memory on ``device`` in ``dtype`` from the canonical ``state``: writing a checkpoint first
    would cost a 3.9B model 15.6 GB of fp32 files and a host round trip for nothing the timing sees."""

    name = "hf-generate"

    def __init__(self, cfg, state: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype):
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(**hf_config_dict(cfg, dtype), attn_implementation="sdpa")
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                model = LlamaForCausalLM(config)
        finally:
            torch.set_default_dtype(default)
        model.load_state_dict({hf_name(k): v for k, v in state.items()}, strict=True)
        self.model, self.device = model.eval(), device

    @torch.no_grad()
    def ttft(self, prompt: list[int]) -> float:
        ids = torch.tensor([prompt], device=self.device)
        t = _now(self.device)
        self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False)
        return _now(self.device) - t

    def start_decode(self, prompts: list[list[int]], steps: int, rounds: int) -> None:
        self.prompts = torch.tensor(prompts, device=self.device)

    @torch.no_grad()
    def decode_round(self, steps: int) -> float:
        from transformers.generation.streamers import BaseStreamer

        class Clock(BaseStreamer):
            def __init__(self):
                self.times: list[float] = []

            def put(self, value):
                self.times.append(_now(device))

            def end(self):
                pass

        clock, device = Clock(), self.device
        ids = self.prompts
        self.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=steps + 1,
            min_new_tokens=steps + 1,
            do_sample=False,
            streamer=clock,
            pad_token_id=0,
        )
        # times[0]: the prompt; times[1]: first new token (after prefill); times[-1]: last new token
        return ids.shape[0] * (len(clock.times) - 2) / (clock.times[-1] - clock.times[1])

    def end_decode(self) -> None:
        pass


# -- memory -------------------------------------------------------------------------------------------
def _proc_status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def measure_peak(contender, prompts: list[list[int]], steps: int) -> tuple[float, str]:
    """(CUDA) Peak memory (MB) of one decode case above what was allocated before it."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    contender.start_decode(prompts, steps, 1)
    contender.decode_round(steps)
    contender.end_decode()
    return (torch.cuda.max_memory_allocated() - base) / 2**20, "cuda max_memory_allocated above the model"


def copy_bandwidth(device: torch.device, gib: float = 2.0, reps: int = 20) -> float:
    """Bytes per second of a device-to-device copy (read + write counted), median of ``reps``."""
    n = int(gib * 2**30) // 4
    src = torch.empty(n, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    return 2 * n * 4 / statistics.median(times)


def build_contenders(args, kinds, base, device, dtype, decode_len: int):
    """Contenders of ``kinds`` over one shape and the same random weights, and their static memory."""
    cuda = device.type == "cuda"
    contenders, info, float_state = [], {}, None
    for kind in kinds:
        if kind == "hf-generate":
            if float_state is None:
                raise SystemExit("hf-generate needs the floatlm contender (the same weights)")
            hf = HFContender(base, float_state, device, dtype)
            contenders.append(hf)
            info[hf.name] = {"model_mb": model_bytes_hf(hf.model) / 2**20, "kv_cache_mb": None}
            continue
        cfg = base.replace(family="trilm" if kind == "trilm" else "floatlm", name=f"{kind}-{args.size}")
        model = build_model(kind, cfg, device, dtype)
        if kind == "floatlm" and "hf-generate" in kinds:
            float_state = {k: v.detach() for k, v in model.state_dict().items()}
        if not args.no_fuse:  # as Engine.load serves a model: Q/K/V and gate/up stacked
            fuse_projections(model)
        graphs = cuda and not args.eager
        engine = Engine(
            model,
            max_batch=max(args.batches),
            max_seq_len=decode_len,
            cuda_graphs=graphs,
            compile=args.compile,
        )
        ttft_engine = Engine(model, max_batch=1, max_seq_len=max(args.ttft) + 2, cuda_graphs=False)
        contenders.append(EngineContender(kind, engine, ttft_engine))
        info[kind] = {
            "model_mb": model_bytes(model) / 2**20,
            "streamed_mb_per_token": streamed_bytes(model) / 2**20,
            "kv_cache_mb": engine.cache.nbytes / 2**20,
            "kv_cache_slots": engine.max_batch,
            "kv_cache_positions": engine.max_seq_len,
        }
    return contenders, info


def memory_probe(args) -> None:
    """(Child process) build one contender, run the largest decode case, print the peak RSS rise."""
    base = preset(f"floatlm-{args.size}", vocab_size=args.vocab, context=max(*args.ttft, *args.depths) + 64)
    kind = args.memory_probe
    kinds = ["floatlm", kind] if kind == "hf-generate" else [kind]
    decode_len = max(args.depths) + args.steps + 16
    contenders, _ = build_contenders(args, kinds, base, torch.device("cpu"), torch.float32, decode_len)
    c = contenders[-1]
    c.ttft(_prompts(base.vocab_size, 16, 1, 99)[0])
    base_rss = _proc_status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS
    c.start_decode(_prompts(base.vocab_size, max(args.depths), max(args.batches), 7), args.steps, 1)
    c.decode_round(args.steps)
    c.end_decode()
    print(json.dumps({"peak_working_mb": (_proc_status("VmHWM") - base_rss) / 2**20}))


def memory_probe_subprocess(args, kind: str) -> tuple[float | None, str]:
    import subprocess

    cmd = [sys.executable, "-m", __spec__.name, "--memory-probe", kind, "--size", args.size]
    cmd += ["--vocab", str(args.vocab)]
    cmd += ["--steps", str(args.steps), "--threads", str(args.threads), "--ttft", *map(str, args.ttft)]
    cmd += ["--depths", *map(str, args.depths), "--batches", *map(str, args.batches)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=CHECKOUT)
    method = "peak RSS rise over the built model, in a fresh process per contender"
    if out.returncode != 0:
        print(f"memory probe of {kind} failed: {out.stderr[-2000:]}", file=sys.stderr)
        return None, method
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_working_mb"], method


# -- the run ------------------------------------------------------------------------------------------
def run(args) -> dict:
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = parse_dtype(args.dtype) if args.dtype != "auto" else (torch.bfloat16 if cuda else torch.float32)
    ttft_lengths = tuple(args.ttft)
    depths, batches, steps = tuple(args.depths), tuple(args.batches), args.steps
    context = max(max(ttft_lengths), max(depths)) + EXTRA_CONTEXT
    base = preset(f"floatlm-{args.size}", vocab_size=args.vocab, context=context)
    rounds = args.rounds
    decode_len = max(depths) + steps * rounds + 16
    print(
        f"model {args.size}: hidden {base.hidden}, layers {base.layers}, vocab {base.vocab_size}, "
        f"context {context}; device {device}, dtype {dtype}, threads {torch.get_num_threads()}",
        flush=True,
    )

    kinds = args.contenders + (["hf-generate"] if args.hf else [])
    contenders, info = build_contenders(args, kinds, base, device, dtype, decode_len)
    names = [c.name for c in contenders]

    for c in contenders:  # warm-up: first calls, kernel launch plans, and every CUDA graph bucket
        c.ttft(_prompts(base.vocab_size, 16, 1, 99)[0])
        for b in batches:
            c.start_decode(_prompts(base.vocab_size, 16, b, 98), 2, 1)
            c.decode_round(2)
            c.end_decode()
        graphs = getattr(getattr(c, "engine", None), "graphs", None)
        if graphs is not None:
            graphs.capture_all()

    ttft: dict[str, dict[int, list[float]]] = {n: {L: [] for L in ttft_lengths} for n in names}
    for r in range(rounds):
        for length in ttft_lengths:
            prompt = _prompts(base.vocab_size, length, 1, seed=length + r)[0]
            for c in contenders:
                ttft[c.name][length].append(c.ttft(prompt))
        print(f"ttft round {r + 1}/{rounds} done", flush=True)

    decode: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    for depth in depths:
        for batch in batches:
            key = f"depth{depth}-batch{batch}"
            prompts = _prompts(base.vocab_size, depth, batch, seed=depth * 100 + batch)
            for c in contenders:
                c.start_decode(prompts, steps, rounds)
                decode[c.name][key] = []
            for _ in range(rounds):
                for c in contenders:
                    decode[c.name][key].append(c.decode_round(steps))
            for c in contenders:
                c.end_decode()
            print(f"decode {key} done", flush=True)

    memory_case = (max(depths), max(batches))
    peak_method = ""
    for c in contenders:
        if not args.peak:
            info[c.name]["peak_working_mb"], peak_method = None, "not measured (--no-peak)"
        elif cuda:
            prompts = _prompts(base.vocab_size, memory_case[0], memory_case[1], seed=7)
            info[c.name]["peak_working_mb"], peak_method = measure_peak(c, prompts, steps)
        else:  # a fresh process per contender, so no allocator holds memory freed by another
            info[c.name]["peak_working_mb"], peak_method = memory_probe_subprocess(args, c.name)

    results: dict = {
        "ttft_ms": {n: {L: 1e3 * statistics.median(v) for L, v in ttft[n].items()} for n in names},
        "decode_tokens_per_s": {n: {k: statistics.median(v) for k, v in decode[n].items()} for n in names},
        "rounds": {
            "ttft_ms": {n: {L: [1e3 * x for x in v] for L, v in ttft[n].items()} for n in names},
            "decode_tokens_per_s": decode,
        },
        "memory": info,
        "memory_peak_case": {"depth": memory_case[0], "batch": memory_case[1], "method": peak_method},
    }
    results["ratios"] = ratios(results, names)
    results["targets"] = targets(results, names, device, info, args)
    return results


def model_bytes_hf(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def ratios(results: dict, names: list[str]) -> dict:
    """Each contender's figures over the FloatLM in the engine (and the engine over ``generate``)."""
    out: dict = {}
    dec, ttft = results["decode_tokens_per_s"], results["ttft_ms"]
    for n in names:
        if n in ("floatlm", "hf-generate") or "floatlm" not in names:
            continue
        out[f"{n}/floatlm decode tokens/s"] = {k: dec[n][k] / dec["floatlm"][k] for k in dec[n]}
        out[f"floatlm/{n} ttft (>1: floatlm slower)"] = {L: ttft["floatlm"][L] / ttft[n][L] for L in ttft[n]}
    if "hf-generate" in names and "floatlm" in names:
        out["engine/hf-generate decode tokens/s"] = {
            k: dec["floatlm"][k] / dec["hf-generate"][k] for k in dec["floatlm"]
        }
        out["engine/hf-generate ttft speed"] = {
            L: ttft["hf-generate"][L] / ttft["floatlm"][L] for L in ttft["floatlm"]
        }
    return out


def targets(results: dict, names: list[str], device: torch.device, info: dict, args) -> dict:
    out: dict = {}
    dec = results["decode_tokens_per_s"]
    case = f"depth{min(args.depths)}-batch1"
    if device.type == "cuda" and "floatlm" in names and case in dec["floatlm"]:
        bw = copy_bandwidth(device)
        achieved = dec["floatlm"][case] * info["floatlm"]["streamed_mb_per_token"] * 2**20
        out["copy_bandwidth_GBps"] = bw / 1e9
        out["floatlm_weight_stream_GBps"] = achieved / 1e9
        out["floatlm_fraction_of_copy_bandwidth"] = {
            "value": achieved / bw,
            "target": ">= 0.60",
            "met": achieved / bw >= 0.60,
            "case": case,
        }
        if "trilm" in names:
            speed = dec["trilm"][case] / dec["floatlm"][case]
            out["trilm_over_floatlm_decode"] = {
                "value": speed,
                "target": ">= 3",
                "met": speed >= 3,
                "case": case,
            }
    else:
        out["floatlm_fraction_of_copy_bandwidth"] = "not measured (needs CUDA; H200 target >= 0.60)"
        out["trilm_over_floatlm_decode"] = "not measured (needs CUDA; H200 target >= 3x)"
    if "hf-generate" in names:
        engine_over_hf = results["ratios"]["engine/hf-generate decode tokens/s"]
        worst = min(engine_over_hf.values())
        out["engine_over_hf_generate_decode_min"] = {
            "value": worst,
            "target": ">= 1.0 (ambition 2.0)",
            "met": worst >= 1.0,
        }
    return out


HF_OFF_ON_CUDA = (
    "not run: off by default on CUDA (it times every case once more, on the GPU in bf16, for a reference "
    "the CPU run gives; --hf runs it)"
)
CONTENDER_KINDS = ("floatlm", "trilm", "quantlm-int4", "quantlm-int2")


def dry_run(parser: argparse.ArgumentParser, args, hf_note: str) -> int:
    """Check what a run would do without building a model (no GPU needed); exit status 2 on a bad value."""
    from trilm.config import ConfigError

    try:
        base = preset(f"floatlm-{args.size}", vocab_size=args.vocab)
    except ConfigError as exc:
        parser.error(f"--size: {exc}")
    if unknown := [c for c in args.contenders if c not in CONTENDER_KINDS]:
        parser.error(f"--contenders: unknown {unknown}; known: {list(CONTENDER_KINDS)}")
    if args.hf and "floatlm" not in args.contenders:
        parser.error("--hf: transformers' generate needs the floatlm contender (the same weights)")
    for flag in ("ttft", "depths", "batches", "steps", "rounds", "threads"):
        value = getattr(args, flag)
        if min(value if isinstance(value, list) else [value]) < 1:
            parser.error(f"--{flag}: must be >= 1, got {value}")
    print(
        f"dry run: {args.device} {args.size} (hidden {base.hidden}, {base.layers} layers), contenders "
        f"{args.contenders}, hf-generate {hf_note}; {args.rounds} rounds of ttft {args.ttft} and decode "
        f"depths {args.depths} × batches {args.batches} × {args.steps} steps, peak memory "
        f"{'on' if args.peak else 'off'} → {args.out or 'no JSON (no --out)'}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--size", default=None, help="preset size (CPU default tiny, CUDA default 3.9b)")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary (default 2048 CPU, 50304 CUDA)")
    p.add_argument("--dtype", default="auto", choices=("auto", *DTYPE_NAMES))
    p.add_argument(
        "--contenders",
        nargs="+",
        default=None,
        help="from floatlm trilm quantlm-int4 quantlm-int2 (default: all on CUDA, "
        "floatlm trilm quantlm-int4 on CPU)",
    )
    p.add_argument(
        "--hf",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="transformers' generate on the same weights (default: on CPU only; on CUDA in bf16 on the GPU)",
    )
    p.add_argument("--ttft", type=int, nargs="+", default=list(TTFT_LENGTHS))
    p.add_argument("--depths", type=int, nargs="+", default=list(DEPTHS))
    p.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    p.add_argument("--steps", type=int, default=None, help="decode steps per round (CPU 32, CUDA 64)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--eager", action="store_true", help="CUDA: decode without CUDA graphs")
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the decode engine's steps (CUDA: captured as its graphs; compiled in the untimed "
        "first step); time to first token stays eager",
    )
    p.add_argument("--no-fuse", action="store_true", help="keep Q/K/V and gate/up apart (the engine stacks)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (1: stable on a busy machine)")
    p.add_argument("--label", default=None, help="results file label (default: device and size)")
    p.add_argument("--out", default=None, help="directory for the results JSON")
    p.add_argument("--markdown", default=None, metavar="JSON", help="print the docs table of a results file")
    p.add_argument("--no-peak", dest="peak", action="store_false", help="skip the peak-memory runs")
    p.add_argument("--memory-probe", default=None, help=argparse.SUPPRESS)
    p.add_argument("--dry-run", action="store_true", help="check the arguments, print the plan, run nothing")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return 0
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available() and not args.dry_run:
        raise SystemExit("--device cuda: no CUDA device available")
    args.size = args.size or ("3.9b" if cuda else "tiny")
    args.vocab = args.vocab or (50304 if cuda else 2048)
    args.steps = args.steps or (64 if cuda else 32)
    args.contenders = args.contenders or (
        ["floatlm", "trilm", "quantlm-int4", "quantlm-int2"] if cuda else ["floatlm", "trilm", "quantlm-int4"]
    )
    if args.hf is None:
        args.hf = not cuda
        hf_note = "CPU default" if args.hf else HF_OFF_ON_CUDA
    else:
        hf_note = "--hf" if args.hf else "--no-hf"
    if args.dry_run:
        return dry_run(p, args, hf_note)
    if not cuda:
        torch.set_num_threads(args.threads)
    if args.memory_probe:
        memory_probe(args)
        return 0
    started = time.time()
    load_before = os.getloadavg()
    results = run(args)
    report = {
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "label")},
        "hf_generate": hf_note,
        "machine_note": None
        if cuda
        else (
            f"shared 2-core machine (other agents running; load average {load_before[0]:.1f} at the start, "
            f"{os.getloadavg()[0]:.1f} at the end): absolute numbers are noisy, ratios were measured side by "
            "side in alternating rounds"
        ),
        "wall_seconds": time.time() - started,
        **results,
    }
    print_table(results)
    if args.out:
        label = args.label or f"{'cuda' if cuda else 'cpu'}-{args.size}"
        path = Path(args.out) / f"serve-{label}-{today()}.json"
        write_result(path, report, module=__spec__.name, argv=argv, indent=2)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
