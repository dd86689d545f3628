#!/usr/bin/env bash
# Everything the CPU cannot show, in one short unattended run on one GPU (~11 minutes on an H200):
#   bash benchmarks/gpu_suite.sh OUTDIR
# 1. training tokens/s, MFU and peak memory of FloatLM/TriLM-1.1B and HF Llama in bf16 through the DeepSpeed
#    engine, with and without compile and recompute, one process per contender, most important first
#    (TRAIN_LIMIT cuts the tail; the JSON keeps what finished; TRAIN_CONTENDERS=levers for one lever at a time),
# 2. the low-bit kernel benchmark (every format × LLaMA shape × batch 1/16/64),
# 3. the GPU-marked tests (kernels in fp16/bf16 at their real configs; bf16 training; GPU vs CPU logits).
# Each stage has its own time limit and writes its results as it goes, so a slow stage cannot starve the rest.
# On a machine without this project's venv, wheels in .whl/ (megatron-core, deepspeed, …) are installed first.
set -uo pipefail
OUT=${1:-benchmarks/results}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if [ -d .whl ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="/tmp/site:$PWD" || exit 1
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  $PY -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/gpu_info.txt"
echo "== 1/3 training benchmark"
timeout "${TRAIN_LIMIT:-270}" $PY benchmarks/train.py --engine --contenders "${TRAIN_CONTENDERS:-matrix}" \
    --timeout 200 --out "$OUT" > "$OUT/train_bench.log" 2>&1
echo "exit $?"; grep -v "^\[20" "$OUT/train_bench.log" | tail -n 30
echo "== 2/3 kernel benchmark"
timeout "${KERNEL_LIMIT:-250}" $PY benchmarks/kernels.py --out "$OUT" > "$OUT/kernels_bench.log" 2>&1
echo "exit $?"; tail -n 40 "$OUT/kernels_bench.log"
echo "== 3/3 GPU tests"
timeout "${TEST_LIMIT:-130}" $PY -m pytest -m gpu tests/kernels tests/train -q -p no:cacheprovider \
    > "$OUT/gpu_tests.log" 2>&1
echo "exit $?"; tail -n 15 "$OUT/gpu_tests.log"
