"""The fixture tree of the robustness catalogue: tiny models (nano, vocabulary 512), good and damaged.

Built once (a few seconds) with this checkout's writers; the cases then only read it. Every damaged
directory is a good one damaged the way a careless user or a failing disk would: cut in half, one exponent
bit flipped, its ``COMPLETE`` marker removed, a foreign ``tokenizer.model`` dropped next to it, a NaN/inf
written by a buggy step, a huge weight, a data split passed as a model.
"""

from __future__ import annotations

import json
import shutil
import socket
import struct
from pathlib import Path

import torch
import yaml

TINY_LAYERS = 2


def flip_exponent_bit(path: Path, tensor: str, index: int = 0) -> float:
    """Flip the second-highest exponent bit of one fp32 weight in place; returns the new value."""
    raw = bytearray(path.read_bytes())
    header_len = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + header_len])
    start = 8 + header_len + header[tensor]["data_offsets"][0] + 4 * index
    raw[start + 3] ^= 0x40
    path.write_bytes(bytes(raw))
    return struct.unpack("<f", bytes(raw[start : start + 4]))[0]


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _run_snapshot(root: Path, cfg, state, tok, step: int = 10) -> Path:
    from trilm.model.flops import parameter_counts
    from trilm.model.snapshot import SnapshotMeta
    from trilm.store.snapshot import write_snapshot

    counts = parameter_counts(cfg)
    meta = SnapshotMeta(
        step=step,
        tokens=step * 1024,
        run=root.name,
        family=cfg.family,
        size="nano",
        params=counts.total,
        nonembedding_params=counts.nonembedding,
        linear_params=counts.linear,
        scale_partitions=cfg.scale_partitions(1),
        tokenizer_hash=tok.hash,
        train_loss=6.0,
        val_loss=6.1,
    )
    snap = write_snapshot(root / "snapshots" / f"step-{step}", cfg, meta, state)
    shutil.copyfile(tok.path, root / "tokenizer.model")
    return snap


def _suite(root: Path, name: str, fixtures: Path, *, finished: bool) -> None:
    """A one-run suite (FloatLM pico) whose run looks finished, or killed at step 2 of 4."""
    from trilm.suite.config import load_suite
    from trilm.train.checkpoint import RunDir

    (root / "runs").mkdir(parents=True)
    text = f"""name: toy
root: {{ROOT}}
families:
- name: floatlm
  config: {Path(__file__).resolve().parents[2] / "configs/train/quickstart-floatlm.yaml"}
sizes:
- name: pico
  preset: nano
  model: {{hidden: 32, ffn: 96, heads: 2, layers: 1}}
tokens:
- 4096
seq_len: 32
checkpoint: {{snapshot_every: 2, log_spaced_until: 1, state_every: 2, keep_last: 2}}
overrides:
  model: {{vocab_size: 512}}
  batch_tokens: 1024
  micro_batch: 8
  log: {{every: 1, tensorboard: false, progress: false}}
data:
  train_dir: {fixtures / "split"}
  valid_dir: {fixtures / "split"}
  tokenizer: {fixtures / "tok/tokenizer.model"}
hardware: {{device: cpu, peak_tflops: 0.2, mfu: 0.25, devices_per_node: 1}}
"""
    real = root / "toy-real.yaml"
    real.write_text(text.replace("{ROOT}", str(root / "runs")))
    suite = load_suite(real)
    real.unlink()
    run = suite.runs[0]
    rd = RunDir(run.run_dir)
    rd.make()
    resolved = run.cfg.replace(model=run.cfg.model.resolved(run.cfg.parallel.tensor_parallel))
    rd.config.write_text(resolved.to_yaml())
    last = run.cfg.steps if finished else 2
    (rd.state_dir(last)).mkdir(parents=True)
    (rd.state_dir(last) / "COMPLETE").write_text(json.dumps({"step": last}))
    records = [{"step": s, "time": 1.0e9 + s, "loss": 6.0, "tokens_per_s": 100.0} for s in range(1, last + 1)]
    (rd.logs / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    # What a training SIGKILLed on this host leaves: a lock file naming it that nobody holds. (A lock
    # recorded by another host may be held there unseen, so status also trusts fresh metrics for that.)
    (rd.root / ".lock").write_text(f"pid 999999 on {socket.gethostname()}, started 2026-01-01T00:00:00\n")
    configs = root / "runs" / "configs"  # where launch writes them: <suite root>/configs
    configs.mkdir()
    (configs / f"{run.name}.yaml").write_text(f"# written by an earlier launch\n{run.cfg.to_yaml()}")
    (root / "toy.yaml").write_text(text)
    assert yaml.safe_load(text.replace("{ROOT}", "x"))["tokens"] == [4096]


def build(root: str | Path) -> Path:
    """Write the fixture tree under ``root`` (which must be new); returns it."""
    from trilm.data import embedded_corpus_dir
    from trilm.data.prepare import PrepareConfig, prepare
    from trilm.data.slimpajama import read_documents, split_files
    from trilm.data.tokenizer import train_tokenizer
    from trilm.export.hf import export_snapshot_hf
    from trilm.formats import IntWeight
    from trilm.model.config import preset
    from trilm.model.snapshot import SnapshotMeta
    from trilm.model.spec import canonical_shapes
    from trilm.store.hf import write_hf_files
    from trilm.store.snapshot import write_snapshot

    root = Path(root)
    root.mkdir(parents=True)
    corpus = embedded_corpus_dir()
    shutil.copytree(corpus / "validation", root / "corpus" / "validation")
    texts = [d.text for f in split_files(corpus, "train")[:3] for d in read_documents(f)]
    tok = train_tokenizer(texts[:60], root / "tok" / "tokenizer.model", vocab_size=512, max_sentences=4000)
    foreign = train_tokenizer(texts[60:140], root / "foreign" / "tokenizer.model", vocab_size=1024)
    (root / "text.txt").write_text("\n\n".join(texts[140:160])[:40_000])
    prepare(
        PrepareConfig(
            input=str(root / "corpus"),
            split="validation",
            tokenizer=str(tok.path),
            out=str(root / "split"),
            progress=False,
        )
    )
    prepare(
        PrepareConfig(
            input=str(root / "corpus"),
            split="validation",
            tokenizer=str(foreign.path),
            out=str(root / "split-foreign"),
            progress=False,
        )
    )

    def state_of(cfg, seed: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        out = {}
        for name, shape in canonical_shapes(cfg).items():
            if name.endswith("norm.weight"):
                out[name] = 1.0 + 0.1 * torch.randn(shape, generator=gen)
            else:
                out[name] = torch.randn(shape, generator=gen) * 0.05
        return out

    fcfg = preset("floatlm-nano", vocab_size=512, layers=TINY_LAYERS)
    tcfg = preset("trilm-nano", vocab_size=512, layers=TINY_LAYERS)
    float_state = state_of(fcfg, 0)
    good = _run_snapshot(root / "float", fcfg, float_state, tok)
    _run_snapshot(root / "trilm", tcfg, state_of(tcfg, 1), tok)

    for name in ("truncated", "flipped", "unfinished"):
        shutil.copytree(root / "float", root / name)
    for name in ("trilm-truncated", "trilm-flipped"):
        shutil.copytree(root / "trilm", root / name)
    _truncate(root / "trilm-truncated/snapshots/step-10/model.safetensors")
    flip_exponent_bit(
        root / "trilm-flipped/snapshots/step-10/model.safetensors", "layers.0.attn.wq.weight", 9
    )
    _truncate(root / "truncated/snapshots/step-10/model.safetensors")
    flip_exponent_bit(root / "flipped/snapshots/step-10/model.safetensors", "layers.1.mlp.w_down.weight", 7)
    (root / "unfinished/snapshots/step-10/COMPLETE").unlink()

    meta = SnapshotMeta(family="floatlm", size="nano", step=10, tokenizer_hash=tok.hash)
    write_snapshot(root / "foreign-tok", fcfg, meta, float_state, tokenizer=tok.path)
    shutil.copyfile(foreign.path, root / "foreign-tok" / "tokenizer.model")
    bad = {k: v.clone() for k, v in float_state.items()}
    bad["layers.0.mlp.w_up.weight"][3, 4] = float("nan")
    write_snapshot(root / "nonfinite", fcfg, meta, bad, tokenizer=tok.path)
    loose = root / "loose-truncated"
    loose.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(good / name, loose / name)
    shutil.copyfile(tok.path, loose / "tokenizer.model")
    _truncate(loose / "model.safetensors")
    huge = {k: v.clone() for k, v in float_state.items()}
    huge["layers.0.mlp.w_down.weight"][1, 2] = 1.0e6
    write_snapshot(root / "huge", fcfg, meta, huge, tokenizer=tok.path)
    huge["layers.0.mlp.w_down.weight"][1, 2] = 1.0e8
    write_snapshot(root / "huger", fcfg, meta, huge, tokenizer=tok.path)

    packed = {
        k.removesuffix(".weight"): IntWeight.from_float(v, bits=4, group_size=32)
        for k, v in float_state.items()
        if k.startswith("layers.") and "norm" not in k
    }
    rest = {k: v for k, v in float_state.items() if k.removesuffix(".weight") not in packed}
    qmeta = SnapshotMeta(
        family="floatlm", size="nano", tokenizer_hash=tok.hash, extra={"quant": {"method": "rtn"}}
    )
    write_snapshot(root / "quantlm", fcfg, qmeta, rest, packed, tokenizer=tok.path)
    shutil.copytree(root / "quantlm", root / "quantlm-truncated")
    _truncate(root / "quantlm-truncated" / "packed.safetensors")
    pcfg = fcfg.replace(layer_ffn=[fcfg.ffn // 2, fcfg.ffn])
    pstate = state_of(pcfg, 2)
    write_snapshot(
        root / "pruned",
        pcfg,
        SnapshotMeta(
            family="floatlm",
            size="nano",
            step=3,
            run="pruned",
            tokenizer_hash=tok.hash,
            extra={"pruning": {"method": "magnitude"}},
        ),
        pstate,
        tokenizer=tok.path,
    )

    export_snapshot_hf(good, root / "hf", dtype="float32")
    for name in ("hf-truncated", "hf-foreign"):
        shutil.copytree(root / "hf", root / name)
    _truncate(root / "hf-truncated" / "model.safetensors")
    shutil.copyfile(foreign.path, root / "hf-foreign" / "tokenizer.model")
    write_hf_files(fcfg, float_state, root / "hf-plain")  # not from trilm: no recorded tokenizer hash
    shutil.copyfile(foreign.path, root / "hf-plain" / "tokenizer.model")

    (root / "notes").mkdir()
    (root / "notes" / "notes.txt").write_text("my notes, not an export\n")
    (root / "notes.gguf").write_bytes(b"not a gguf written by trilm\n")
    _suite(root / "suite-finished", "toy", root, finished=True)
    _suite(root / "suite-stopped", "toy", root, finished=False)
    return root


if __name__ == "__main__":
    import sys

    print(build(sys.argv[1]))
