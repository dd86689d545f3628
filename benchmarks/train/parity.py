"""Parity errors of the tensor-parallel and Hugging Face paths, measured (fp32, CPU, gloo).

    python -m benchmarks.train.parity [--json benchmarks/results/parity.json]

Prints max |Δlogits| for: TP=2 vs TP=1 from the same full weights per family; a TriLM/BiLM trained at TP=2
loaded at TP=1; export to transformers' LlamaForCausalLM and import back. The tests assert ≤ 1e-5; this script
prints the actual values quoted in the docs.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from benchmarks.common import write_result
from trilm.local_ranks import run_distributed
from trilm.model import build_model, preset
from trilm.parallel import ParallelConfig, init_parallel, shutdown_parallel
from trilm.store.hf import write_hf_files
from trilm.store.open import open_model
from trilm.train.models import load_model, save_model


def import_hf(path, family=None):
    """(config, canonical state) of an HF directory, read through the store."""
    opened = open_model(path, family=family)
    return opened.config, opened.weights.float_state()


def tp2(cfg, state, ids, snap):
    init_parallel(ParallelConfig(tensor_parallel=2))
    m = build_model(cfg, seed=None)
    if state is None:
        m.reset_parameters(7)
    else:
        m.load_full_state_dict(state)
    with torch.no_grad():
        out = m(ids)
    if snap:
        save_model(m, snap)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="also write the errors here")
    args = parser.parse_args(argv)
    errors: dict[str, float] = {}

    def report(label: str, value: torch.Tensor) -> None:
        errors[label] = float(value)
        print(f"{label} max|dlogit| = {float(value):.2e}")

    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    for fam in ("floatlm", "trilm", "bilm"):
        cfg = preset(f"{fam}-tiny", vocab_size=256, quant={"partitions": 1})
        ref = build_model(cfg, tp=1, seed=3)
        with torch.no_grad():
            want = ref(ids)
        got = run_distributed(tp2, 2, cfg, ref.full_state_dict(), ids, None)[0]
        report(f"{fam}: TP=2 vs TP=1 (same full weights, P=1)", (got - want).abs().max())
        shutdown_parallel()
    for fam in ("trilm", "bilm"):
        with tempfile.TemporaryDirectory() as d:
            cfg = preset(f"{fam}-tiny", vocab_size=256)
            got = run_distributed(tp2, 2, cfg, None, ids, d)[0]
            m = load_model(d, tp=1)
            with torch.no_grad():
                want = m(ids)
            report(f"{fam}: trained-at-TP=2 snapshot loaded at TP=1", (got - want).abs().max())
            shutdown_parallel()
    for fam in ("floatlm", "trilm", "bilm"):
        with tempfile.TemporaryDirectory() as d:
            m = build_model(preset(f"{fam}-tiny", vocab_size=256, quant={"partitions": 2}), tp=1, seed=5)
            write_hf_files(m.cfg, m.full_state_dict(), d)
            hf = LlamaForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
            with torch.no_grad():
                a, b = m(ids), hf(ids).logits
            cfg2, st = import_hf(d, family=fam)
            m2 = build_model(cfg2, tp=1, seed=None)
            m2.load_full_state_dict(st)
            with torch.no_grad():
                c = m2(ids)
            report(f"{fam}: export->transformers", (a - b).abs().max())
            report(f"{fam}: export->transformers->import back", (a - c).abs().max())
        shutdown_parallel()
    if args.json:
        write_result(args.json, {"max_abs_logit_error": errors}, module=__spec__.name, argv=argv)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
