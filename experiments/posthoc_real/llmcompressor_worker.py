"""llmcompressor's GPTQ on the same model, calibration windows and settings as trilm's (for ``run.py``).

Run by :mod:`experiments.posthoc_real.run` with the interpreter of a separate environment holding
llmcompressor (it pins transformers ≤ 5.17, trilm 5.24), so this module imports nothing of trilm::

    data_cache/lc-venv/bin/python -P experiments/posthoc_real/llmcompressor_worker.py --hf HF_DIR \\
        --windows W.pt --bits 3 --group-size 64 --out OUT_DIR

The settings are trilm's GPTQ defaults spelled in llmcompressor's terms: asymmetric integer grid per group of
``--group-size`` input columns, no act-order, 128-column blocks, dampening 0.01, every block linear
(``lm_head`` left in float, as trilm leaves the head). The calibration set is the very token windows trilm
drew (saved by the caller). OUT holds the model with its weights replaced by llmcompressor's quantized values
(dense, as GPTQ leaves them in the module), the source's config and tokenizer files, and ``timing.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hf", required=True)
    parser.add_argument("--windows", required=True)
    parser.add_argument("--bits", type=int, required=True)
    parser.add_argument("--group-size", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import torch
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.hf, dtype=torch.float32).eval()
    windows = torch.load(args.windows)
    data = Dataset.from_dict(
        {"input_ids": windows.tolist(), "attention_mask": torch.ones_like(windows).tolist()}
    )
    scheme = QuantizationScheme(
        targets=["Linear"],
        weights=QuantizationArgs(
            num_bits=args.bits, type="int", symmetric=False, strategy="group", group_size=args.group_size
        ),
    )
    recipe = GPTQModifier(
        config_groups={"group_0": scheme},
        ignore=["lm_head"],
        block_size=128,
        dampening_frac=0.01,
        actorder=None,
    )
    names = {k for k, _ in model.named_parameters()}  # before oneshot adds weight_scale, weight_zero_point
    start = time.perf_counter()
    oneshot(model=model, dataset=data, recipe=recipe, num_calibration_samples=len(windows))
    seconds = time.perf_counter() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k in names}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    for name in (
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ):
        if (Path(args.hf) / name).is_file():
            shutil.copy(Path(args.hf) / name, out / name)
    (out / "timing.json").write_text(json.dumps({"oneshot_s": seconds, "samples": len(windows)}) + "\n")
    print(f"llmcompressor GPTQ W{args.bits} g{args.group_size}: {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
