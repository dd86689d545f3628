"""Training-speed and memory ratios measured side by side in one run.

    python -m benchmarks.train                       # CPU: TriLM/FloatLM step time, trilm vs HF Llama
    python -m benchmarks.train --engine --out benchmarks/results   # the trainer's engine, every lever

Plain loop (default; targets): TriLM step time / FloatLM step time ≤ 1.10 (fake-quant must be cheap); trilm
FloatLM training tokens/s ÷ transformers' ``LlamaForCausalLM`` with the same shape, batch and threads ≥ 1.0.
Each contender runs in alternating rounds and the median round counts, so machine noise hits all alike.

``--engine``: FloatLM, TriLM and transformers' ``LlamaForCausalLM`` (same shape) through the trainer's own
DeepSpeed engine (``build_engine``), with and without ``compile`` and activation ``recompute`` (``--contenders
matrix``), each lever alone against its family's baseline (``--contenders levers``: compile, recompute,
fused/foreach AdamW, fused quantizer), or FloatLM and TriLM compiled, then eager (``--contenders compile``:
the GPU suite's short stage). Without an importable DeepSpeed the contenders run in a plain loop (torch AdamW,
bf16 autocast on CUDA) and the JSON says so and why. Tokens/s, MFU (the one FLOPs function over the device's
peak; none on a CPU) and peak memory; every contender in its own process so peak memory is its own. GPU (bf16,
FloatLM-1.1B, micro-batch 8 × 2048): targets MFU ≥ 40 % and TriLM within 5 % of it. The JSON (with the device
name, date and every configuration) is rewritten after each contender, so a run cut short by a time limit
still leaves its results.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import CHECKOUT, today, write_result
from trilm.model import build_model, flops_per_token, preset
from trilm.store.hf import write_hf_files


def _trainer_step(model, opt, batch):
    loss = model(batch[:, :-1], labels=batch[:, 1:]).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def _hf_step(model, opt, batch):
    # transformers shifts labels itself: the same next-token loss over the same window as _trainer_step
    inputs = batch[:, :-1]
    loss = model(input_ids=inputs, labels=inputs).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def cpu_benchmark(size: str, batch: int, seq: int, rounds: int, steps: int) -> dict:
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    base = preset(f"floatlm-{size}", vocab_size=2048, context=seq)
    contenders = {}
    for family in ("floatlm", "trilm"):
        model = build_model(base.replace(family=family, name=f"{family}-{size}"), seed=0)
        contenders[family] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4), _trainer_step)
    with tempfile.TemporaryDirectory() as tmp:
        write_hf_files(base, contenders["floatlm"][0].full_state_dict(), tmp)
        hf = LlamaForCausalLM.from_pretrained(tmp, torch_dtype=torch.float32, attn_implementation="sdpa")
    hf.train()
    contenders["hf-llama"] = (hf, torch.optim.AdamW(hf.parameters(), lr=1e-4), _hf_step)
    data = torch.randint(0, 2048, (batch, seq + 1))
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for model, opt, step in contenders.values():
        step(model, opt, data)  # warm-up
    for _ in range(rounds):
        for name, (model, opt, step) in contenders.items():
            t = time.perf_counter()
            for _ in range(steps):
                step(model, opt, data)
            times[name].append((time.perf_counter() - t) / steps)
    med = {k: statistics.median(v) for k, v in times.items()}
    tokens = batch * seq
    return {
        "config": {
            "size": size,
            "batch": batch,
            "seq": seq,
            "threads": torch.get_num_threads(),
            "rounds": rounds,
            "steps_per_round": steps,
        },
        "step_seconds": med,
        "tokens_per_s": {k: tokens / v for k, v in med.items()},
        "trilm_over_floatlm_step_time": med["trilm"] / med["floatlm"],
        "floatlm_over_hf_tokens_per_s": med["hf-llama"] / med["floatlm"],
    }


# ---- the engine benchmark: one fresh process per contender ----------------------------------------------
# A contender is a family plus the levers of TrainConfig it turns on. Each runs in its own process, so its
# peak memory is its own (a second model built in the same process inherits the first one's leftovers:
# the 84.4 GB TriLM figure of issue 16 was measured right after FloatLM in one process).
MATRIX = [  # most telling first: a time limit that cuts the list keeps the baselines
    (name, family, {"compile": "compile" in name, "recompute": "all" if "recompute" in name else 0})
    for lever in ("", "+compile", "+recompute", "+compile+recompute")
    for family in ("floatlm", "trilm")
    for name in [family + lever]
]
MATRIX.insert(2, ("hf-llama", "hf", {}))
LEVERS = [
    (name, family, overrides)
    for family in ("floatlm", "trilm")
    for name, overrides in [
        (family, {}),
        (f"{family}+compile", {"compile": True}),
        (f"{family}+recompute", {"recompute": "all"}),
        (f"{family}+fused_adamw", {"optim.fused": True}),
        (f"{family}+foreach_adamw", {"optim.fused": False}),
    ]
    + ([(f"{family}+fused_quantizer", {"fused_quantizer": True})] if family != "floatlm" else [])
] + [("trilm+distill", "trilm", {"distill": True}), ("hf-llama", "hf", {})]
DISTILL = [("trilm", "trilm", {}), ("trilm+distill", "trilm", {"distill": True})]
"""A TriLM step alone and with distillation from a FloatLM teacher of its size (its forward on the same
batch, frozen: bf16 on GPU, fp32 on CPU), so the ratio is the teacher's cost (``init_from`` conversions)."""
COMPILE = [  # the configs' default on CUDA (compile: auto) first, then eager for the ratio
    (f"{family}{lever}", family, {"compile": bool(lever)})
    for lever in ("+compile", "")
    for family in ("floatlm", "trilm")
]
CONTENDERS = {
    "compile": COMPILE,
    "distill": DISTILL,
    "matrix": MATRIX,
    "levers": LEVERS,
    "all": MATRIX + [c for c in LEVERS if c[0] not in {m[0] for m in MATRIX}],
}


def _engine_config(spec: dict, cuda: bool):
    from trilm.train.config import TrainConfig

    family = "floatlm" if spec["family"] == "hf" else spec["family"]
    mb, seq = spec["micro_batch"], spec["seq"]
    cfg = TrainConfig.from_dict(
        {
            "model": {"preset": f"{family}-{spec['size']}", "context": max(seq, 128)},
            "data": {"train_dir": "unused"},
            "seq_len": seq,
            "batch_tokens": mb * seq,
            "tokens": mb * seq * 1000,
            "micro_batch": mb,
            "zero_stage": 0,
            "precision": "bf16" if cuda else "fp32",
            "compile": False,  # each contender names its levers; the trainer's default (auto) would differ
        }
    )
    levers = {k: v for k, v in spec["overrides"].items() if k != "distill"}
    return cfg.with_overrides([f"{k}={v}" for k, v in levers.items()])


def _static_bytes(engine) -> int:
    """Parameters, gradients and optimizer state alive between steps (CPU: added to the step's peak)."""
    from trilm.memory import tensor_bytes

    tensors = []
    for p in engine.module.parameters():
        tensors += [p, p.grad]
    for state in engine.optimizer.state.values():
        tensors += [v for v in state.values() if torch.is_tensor(v)]
    return tensor_bytes(tensors)


def run_contender(spec: dict) -> dict:
    """One contender in this (fresh) process: warm-up, timed steps, then the memory figure."""
    from trilm.memory import measure_peak
    from trilm.model.transformer import Decoder
    from trilm.parallel import init_parallel, shutdown_parallel
    from trilm.train.engine import build_engine, prepare_model, set_optimizer_hparams
    from trilm.train.metrics import peak_flops

    torch.manual_seed(0)
    info = init_parallel()
    cuda = info.device.type == "cuda"
    cfg = _engine_config(spec, cuda)
    model = Decoder(cfg.model.resolved(1), info, seed=0)
    if spec["family"] == "hf":
        from transformers import LlamaForCausalLM

        with tempfile.TemporaryDirectory() as tmp:
            write_hf_files(model.cfg, model.full_state_dict(), tmp)
            model = LlamaForCausalLM.from_pretrained(
                tmp, torch_dtype=torch.float32, attn_implementation="sdpa"
            )
        model.train()
        step_loss = _hf_loss
    else:
        prepare_model(model, cfg, info.device)
        step_loss = _decoder_loss
    if spec["overrides"].get("distill"):
        step_loss = _distill_loss(cfg, info, cuda)
    if spec.get("plain"):
        engine = PlainEngine(model.to(info.device), cfg, cuda)
    else:
        engine = build_engine(model.to(info.device), cfg, 1, info)
    set_optimizer_hparams(engine, 1e-4, 0.1)
    mb, seq = cfg.micro_batch, cfg.sequence_length
    data = torch.randint(0, cfg.model.vocab_size, (mb, seq + 1), device=info.device)

    def step():
        engine.backward(step_loss(engine, data))
        engine.step()

    def now() -> float:
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    t = now()
    for _ in range(spec["warmup"]):
        step()
    warmup_s = now() - t
    wall, cpu = [], []
    for _ in range(spec["steps"]):
        t, c = now(), time.process_time()
        step()
        wall.append(now() - t)
        cpu.append(time.process_time() - c)
    # On a GPU the wall clock is the measure. On a shared CPU it mostly measures the other jobs; the
    # process's CPU time (one thread) is the work of the step itself.
    seconds = statistics.median(wall if cuda else cpu)
    if cuda:
        peak_bytes, method = torch.cuda.max_memory_allocated(), "torch.cuda.max_memory_allocated (whole run)"
    else:
        static = _static_bytes(engine)
        with measure_peak("cpu") as peak:
            step()
        peak_bytes = static + peak.peak_bytes
        method = "parameters + gradients + optimizer state + allocator-level step peak (torch.profiler)"
    tok_s = mb * seq / seconds
    fpt = flops_per_token(cfg.model, seq)
    peak = peak_flops()
    shutdown_parallel()
    return {
        "family": spec["family"],
        "overrides": spec["overrides"],
        "step_seconds": seconds,
        "timing": "wall clock" if cuda else "process CPU time (1 thread; the machine is shared)",
        "step_wall_seconds": statistics.median(wall),
        "warmup_seconds": warmup_s,
        "tokens_per_s": tok_s,
        "tflops": tok_s * fpt / 1e12,
        "mfu": tok_s * fpt / peak if peak else None,
        "peak_memory_gb": peak_bytes / 1e9,
        "memory_method": method,
    }


class PlainEngine:
    """What ``build_engine`` offers a contender (forward, backward, step), without DeepSpeed: torch's
    AdamW and, on CUDA, bf16 autocast over fp32 weights (DeepSpeed's bf16 engine keeps bf16 weights and
    fp32 masters, so memory figures differ). Used only when DeepSpeed cannot be imported."""

    def __init__(self, module: torch.nn.Module, cfg, cuda: bool):
        from trilm.train.engine import param_groups

        self.module, self.cuda = module, cuda
        self.optimizer = torch.optim.AdamW(param_groups(module, cfg.optim.weight_decay), fused=cuda)

    def __call__(self, *args, **kwargs):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.cuda):
            return self.module(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def deepspeed_missing() -> str | None:
    """Why DeepSpeed cannot be imported here (None: it can); the engine benchmark then runs plain loops."""
    try:
        import deepspeed  # noqa: F401
    except Exception as exc:  # an ImportError, or a broken dependency raising anything at import
        return f"{type(exc).__name__}: {exc}"
    return None


def _decoder_loss(engine, batch):
    return engine(batch[:, :-1], labels=batch[:, 1:]).mean()


def _distill_loss(cfg, info, cuda: bool):
    """The trainer's distilled loss with a FloatLM teacher of the student's size (random weights: the cost
    does not depend on them)."""
    from trilm.model.transformer import Decoder
    from trilm.train.distill import Teacher

    teacher_cfg = cfg.model.replace(family="floatlm", name=cfg.model.name.replace("trilm", "floatlm"))
    model = Decoder(teacher_cfg, info, seed=1).to(
        info.device, dtype=torch.bfloat16 if cuda else torch.float32
    )
    teacher = Teacher(model, cfg.model.vocab_size, temperature=1.0, weight=0.5)

    def loss(engine, batch):
        inputs = batch[:, :-1]
        return teacher.loss(engine(inputs), batch[:, 1:], teacher.log_probs(inputs))[0]

    return loss


def _hf_loss(engine, batch):
    inputs = batch[:, :-1]  # transformers shifts the labels itself: the same next-token loss
    return engine(input_ids=inputs, labels=inputs).loss


def engine_benchmark(args, out_path: Path | None) -> dict:
    """Every contender in its own process, one after another; results written after each one."""
    from trilm.train.metrics import device_name, peak_flops

    cuda = torch.cuda.is_available()
    size = args.size or ("1.1b" if cuda else "micro")
    mb, seq = args.batch or (8 if cuda else 4), args.seq or (2048 if cuda else 256)
    chosen = _chosen(args)
    missing = deepspeed_missing()
    if missing:
        print(f"DeepSpeed not importable ({missing}): plain loops instead of the engine", flush=True)
    res = {
        "device": device_name(),
        "peak_flops": peak_flops(),
        "machine": "GPU"
        if cuda
        else "CPU, 2 cores shared with other jobs: ratios only, absolute figures noisy",
        "config": {
            "size": size,
            "micro_batch": mb,
            "seq": seq,
            "precision": "bf16" if cuda else "fp32",
            "engine": "DeepSpeed, ZeRO 0, one device (the trainer's build_engine)"
            if not missing
            else f"plain loop: torch AdamW, bf16 autocast on CUDA (DeepSpeed not importable: {missing})",
            "threads": None if cuda else args.threads,
            "warmup_steps": args.warmup,
            "timed_steps": args.steps,
            "repeats": args.repeats,
            "torch": torch.__version__,
        },
        "results": {},
        "failed": {},
    }
    runs: dict[str, list[dict]] = {}
    # a private compile cache: the default one in /tmp is shared with every other job on the machine
    cache = tempfile.mkdtemp(prefix="trilm-bench-inductor-")
    for repeat in range(args.repeats):
        for name, family, overrides in chosen:
            spec = {"family": family, "overrides": overrides, "size": size, "micro_batch": mb, "seq": seq}
            spec |= {"warmup": args.warmup, "steps": args.steps, "plain": bool(missing)}
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            if not cuda:
                env["OMP_NUM_THREADS"] = str(args.threads)
            cmd = [sys.executable, "-m", __spec__.name, "--worker", json.dumps(spec)]
            cmd += ["--threads", str(args.threads)]
            try:
                proc = subprocess.run(
                    cmd, capture_output=True, text=True, env=env, timeout=args.timeout, cwd=CHECKOUT
                )
                line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
                if proc.returncode or not line:
                    raise RuntimeError(f"exit {proc.returncode}: {proc.stderr[-1500:]}")
                runs.setdefault(name, []).append(json.loads(line[-1][7:]))
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                res["failed"][f"{name} (repeat {repeat + 1})"] = str(exc)[-1500:]
                print(f"{name:28s} failed: {str(exc)[-300:]}", flush=True)
                continue
            r = runs[name][-1]
            print(
                f"[{repeat + 1}/{args.repeats}] {name:28s} {r['tokens_per_s']:>9.0f} tok/s  "
                f"MFU {_pct(r['mfu'])}  peak {r['peak_memory_gb']:.3f} GB  "
                f"step {r['step_seconds'] * 1e3:.0f} ms",
                flush=True,
            )
            res["results"] = {k: _median_run(v) for k, v in runs.items()}
            res["ratios"] = _ratios(res["results"])
            if out_path is not None:
                write_result(out_path, res, module=__spec__.name, indent=2)
    shutil.rmtree(cache, ignore_errors=True)
    if out_path is not None:
        write_result(out_path, res, module=__spec__.name, indent=2)
    return res


def _chosen(args) -> list:
    chosen = CONTENDERS[args.contenders]
    if args.only:
        names = args.only.split(",")
        if unknown := [n for n in names if n not in {c[0] for c in chosen}]:
            raise SystemExit(
                f"--only: {unknown} not in --contenders {args.contenders} ({[c[0] for c in chosen]})"
            )
        chosen = [c for c in chosen if c[0] in names]
    return chosen


def dry_run(args) -> int:
    """Check the arguments and print the plan (contenders, shapes, DeepSpeed or not); runs no step."""
    from trilm.config import ConfigError

    cuda = torch.cuda.is_available()
    size = args.size or ("1.1b" if cuda else "micro")
    for flag in ("batch", "seq", "steps", "warmup", "repeats", "timeout", "threads"):
        value = getattr(args, flag)
        if value is not None and value < (0 if flag == "warmup" else 1):
            raise SystemExit(f"--{flag}: must be >= {0 if flag == 'warmup' else 1}, got {value}")
    try:
        preset(f"floatlm-{size}")
    except ConfigError as exc:
        raise SystemExit(f"--size: {exc}") from None
    if not args.engine:
        print(f"dry run: plain loop, FloatLM/TriLM/HF Llama at {size} on CPU")
        return 0
    names = [c[0] for c in _chosen(args)]
    missing = deepspeed_missing()
    engine = "DeepSpeed engine" if not missing else f"plain loops (DeepSpeed not importable: {missing})"
    print(
        f"dry run: {len(names)} contenders {names} at {size}, micro-batch {args.batch or 'default'} × "
        f"{args.seq or 'default'}, {args.warmup} warm-up + {args.steps or 'default'} timed steps, "
        f"{args.timeout} s each, through the {engine} → {args.out or 'no JSON (no --out)'}"
    )
    return 0


def _pct(x) -> str:
    return f"{x * 100:5.1f}%" if x is not None else "  n/a"


def _median_run(runs: list[dict]) -> dict:
    mid = sorted(runs, key=lambda r: r["step_seconds"])[len(runs) // 2]
    return {**mid, "step_seconds_all": [r["step_seconds"] for r in runs]}


def _ratios(results: dict) -> dict:
    """Side-by-side ratios: TriLM vs FloatLM under the same levers, each lever vs its family's baseline."""
    out = {}
    for name, r in results.items():
        if name.startswith("trilm"):
            twin = "floatlm" + name[len("trilm") :]
            if twin in results:
                out[f"{name} / {twin} step time"] = r["step_seconds"] / results[twin]["step_seconds"]
                out[f"{name} / {twin} peak memory"] = r["peak_memory_gb"] / results[twin]["peak_memory_gb"]
        family = name.split("+")[0]
        if "+" in name and family in results:
            base = results[family]
            out[f"{name} / {family} tokens/s"] = r["tokens_per_s"] / base["tokens_per_s"]
            out[f"{name} / {family} peak memory"] = r["peak_memory_gb"] / base["peak_memory_gb"]
    if "hf-llama" in results and "floatlm" in results:
        out["floatlm / hf-llama tokens/s"] = (
            results["floatlm"]["tokens_per_s"] / results["hf-llama"]["tokens_per_s"]
        )
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--engine",
        action="store_true",
        help="FloatLM/TriLM/HF through the trainer's DeepSpeed engine: tokens/s, MFU, peak memory per lever",
    )
    p.add_argument("--contenders", choices=sorted(CONTENDERS), default="matrix", help="engine: which set")
    p.add_argument("--only", default=None, help="engine: comma-separated contender names to run")
    p.add_argument("--size", default=None, help="preset size (CPU default micro, GPU default 1.1b)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=None, help="timed steps (engine: per contender)")
    p.add_argument("--warmup", type=int, default=3, help="engine: untimed steps first (compilation)")
    p.add_argument("--repeats", type=int, default=1, help="engine: run the contender list this many times")
    p.add_argument("--timeout", type=int, default=900, help="engine: seconds per contender")
    p.add_argument("--out", default=None, help="directory for the results JSON")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads for every contender (1: multi-threaded timings swing on a busy machine)",
    )
    p.add_argument("--dry-run", action="store_true", help="check the arguments, print the plan, run nothing")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.dry_run:
        return dry_run(args)
    if not torch.cuda.is_available():
        torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.worker:
        print("RESULT " + json.dumps(run_contender(json.loads(args.worker))), flush=True)
        return 0
    date = today()
    out = Path(args.out) if args.out else None
    if args.engine:
        from trilm.train.metrics import device_name

        args.steps = args.steps or (10 if torch.cuda.is_available() else 4)
        device = device_name().replace(" ", "_")
        path = out / f"train-engine-{args.contenders}-{device}-{date}.json" if out else None
        res = engine_benchmark(args, path)
        print()
        for key, value in res.get("ratios", {}).items():
            print(f"{key:55s} {value:.3f}")
        if path:
            print(f"wrote {path}")
        return 0 if res["results"] else 1
    res = cpu_benchmark(args.size or "micro", args.batch or 16, args.seq or 256, args.rounds, args.steps or 3)
    for name, tok in res["tokens_per_s"].items():
        print(f"{name:9s} {tok:>9.0f} tok/s  ({res['step_seconds'][name] * 1e3:.0f} ms/step)")
    print(f"TriLM / FloatLM step time:       {res['trilm_over_floatlm_step_time']:.3f} (target ≤ 1.10)")
    print(f"trilm FloatLM / HF Llama tok/s:  {res['floatlm_over_hf_tokens_per_s']:.3f} (target ≥ 1.0)")
    if out:
        path = out / f"train-cpu-cpu-{date}.json"
        write_result(path, res, module=__spec__.name, indent=2)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
