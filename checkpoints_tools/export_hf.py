"""Export a trilm snapshot as a Hugging Face ``LlamaForCausalLM`` directory (or import one).

    python checkpoints_tools/export_hf.py runs/quickstart/trilm-tiny/snapshots/step-80 out/trilm-tiny-hf
    python checkpoints_tools/export_hf.py --import HF_DIR out/snapshot [--family trilm]

The same as ``trilm export hf`` / ``trilm import hf``: TriLM/BiLM weights are written unpacked (γ·Ŵ) with
``pretraining_model_parallel`` recording the scale partitions, as Spectra released its models.
"""

from __future__ import annotations

import sys

from trilm.cli import main as trilm_main

if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--import":
        sys.exit(trilm_main(["import", "hf", *args[1:]]))
    sys.exit(trilm_main(["export", "hf", *args]))
