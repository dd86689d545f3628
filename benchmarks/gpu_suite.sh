#!/usr/bin/env bash
# Everything the CPU cannot show, in one short unattended run on one GPU (the stage limits add up to 11 minutes):
#   bash benchmarks/gpu_suite.sh OUTDIR
# 1. the low-bit kernel benchmark (issue 11): ternary, binary, int2, int3, int4 at 8192×8192, batch 1 and 16,
#    L2-flushed and as a CUDA graph over layer copies larger than L2, % of the copy bandwidth measured in the
#    same run, and the whole-model single-token forward (FloatLM-1.1B bf16 vs TriLM-1.1B packed vs int4);
#    the kernel tuning cache it fills is kept in OUTDIR/kernel_tuning.json,
# 2. the GPU-marked tests (kernels in fp16/bf16 at every config, one launch per call, CUDA graphs; bf16
#    training; CUDA-graph decode of the serving engine; post-hoc and pruning on CUDA),
# 3. training tokens/s, MFU and peak memory of FloatLM/TriLM-1.1B and HF Llama in bf16 through the DeepSpeed
#    engine, one process per contender, most important first (TRAIN_LIMIT cuts the tail; the JSON keeps what
#    finished; TRAIN_CONTENDERS=levers for one lever at a time),
# 4. the serving benchmark (issue 12): FloatLM/TriLM/QuantLM-3.9B with random weights — time to first token,
#    decode tokens/s, memory, and the two H200 targets.
# Each stage has its own time limit and writes its results as it goes, so a slow stage cannot starve the rest;
# the JSON results (device name and date in the file name and inside) land in OUTDIR.
# On a machine without this project's venv, wheels in .whl/ (megatron-core, deepspeed, …) are installed first.
set -uo pipefail
OUT=${1:-benchmarks/results}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TRILM_KERNEL_CACHE="$PWD/$OUT/kernel_tuning.json"
case "$OUT" in /*) export TRILM_KERNEL_CACHE="$OUT/kernel_tuning.json" ;; esac
if [ -d .whl ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="/tmp/site:$PWD" || exit 1
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  $PY -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/gpu_info.txt"
echo "== 1/4 kernel benchmark"
timeout "${KERNEL_LIMIT:-240}" $PY -m benchmarks.kernels --formats ternary binary int2 int3 int4 \
    --shapes 8192x8192 --batches 1 16 --out "$OUT" > "$OUT/kernels_bench.log" 2>&1
echo "exit $?"; tail -n 30 "$OUT/kernels_bench.log"
echo "== 2/4 GPU tests"
timeout "${TEST_LIMIT:-130}" $PY -m pytest -m gpu tests -q -p no:cacheprovider \
    > "$OUT/gpu_tests.log" 2>&1
echo "exit $?"; tail -n 15 "$OUT/gpu_tests.log"
echo "== 3/4 training benchmark"
timeout "${TRAIN_LIMIT:-150}" $PY -m benchmarks.train --engine --contenders "${TRAIN_CONTENDERS:-matrix}" \
    --timeout 120 --out "$OUT" > "$OUT/train_bench.log" 2>&1
echo "exit $?"; grep -v "^\[20" "$OUT/train_bench.log" | tail -n 30
echo "== 4/4 serving benchmark"
timeout "${SERVE_LIMIT:-150}" $PY -m benchmarks.serve --device cuda --size 3.9b --out "$OUT" > "$OUT/serve_bench.log" 2>&1
echo "exit $?"; tail -n 30 "$OUT/serve_bench.log"
