#!/usr/bin/env bash
# Every command behind docs/results/ternarize-real/, from the repository root, as the result files record them.
# The driver is resumable: the float snapshot, the tokenized corpus, the pilot and each trained arm are kept in
# --work and skipped on a rerun. The model is posthoc-real's (experiments/posthoc_real/commands.sh, step 1).
set -euo pipefail

# 1. The pilot fixes the token budget (state.json in --work); results.json records only the last command, so
#    the pilot's own line is the stage as the driver names it.
python -m experiments.ternarize_real --work runs/ternarize-real --stages model,data,pilot --arms kd
# 2. Train the distilled arm for that budget and evaluate it beside the float model: README.md, results.json.
python -m experiments.ternarize_real --work runs/ternarize-real --stages model,data,train,eval --arms kd

# 3. The converted TriLM's TQ2_0 GGUF in llama.cpp against trilm (llama-cpp.json).
python -m experiments.posthoc_real.llama_cpp --model runs/ternarize-real/runs/conv-kd/snapshots/step-32 \
    --type tq2_0 --fallback f16 --tokenizer-pre smollm --tokens 256 --gen 8 --threads 2 \
    --out docs/results/ternarize-real/llama-cpp.json
