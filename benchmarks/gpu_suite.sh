#!/usr/bin/env bash
# Everything the CPU cannot show, in one unattended run of at most 7 minutes on one H200, install included:
#   bash benchmarks/gpu_wheels.sh                  # once, on a machine that reaches PyPI: fills .whl/
#   bash benchmarks/gpu_suite.sh OUTDIR            # on the GPU machine (carry .whl/ along)
#   bash benchmarks/gpu_suite.sh --full OUTDIR     # every GPU test, not the fast selection (over 7 minutes)
#   bash benchmarks/gpu_suite.sh --dry-run OUTDIR  # CPU/CI: the same command lines, each with --dry-run
# Stages, in order, each bounded by `timeout` at its own budget (printed first; they add up to ≤ 420 s):
# 1. install: .whl/ into /tmp/site (trilm's own wheel: a checkout has no trilm.kernels; transformers 5.24:
#    the image's 5.17 cannot import LlamaForCausalLM beside a top-level kernels/; megatron-core, DeepSpeed);
#    every later python runs with PYTHONSAFEPATH=1 and PYTHONPATH=/tmp/site:<checkout>, so the installed
#    trilm wins and benchmarks/ and tests/ still import from the checkout;
# 2. kernels: ternary/binary/int2/int4 GEMV and GEMM at 8192² and the Spectra layer shapes, batch 1 and 16,
#    at 8192² batch 2 and 8 on both the tensor-core GEMM (their default) and the GEMV, and batch 1 on the
#    fp16-pair GEMV plans beside the tuned one (the tuning cache starts from the one committed for this
#    device, if any, and is kept in OUTDIR);
# 3. decode: the whole-model one-token step, FloatLM bf16 vs packed TriLM vs int4 at 1.1B and 3.9B;
# 4. GPU tests: -m "gpu and not slow" (--full: -m gpu); each outcome lands in gpu-tests.jsonl as it is known
#    and the process ends once pytest is done (benchmarks/gpu_pytest.py says why);
# 5. training: FloatLM/TriLM-1.1B through the trainer's DeepSpeed engine, compiled first, then eager;
# 6. serving: FloatLM/TriLM/int4 3.9B with random weights, fewer cases than the benchmark's default.
# A stage cut by its budget keeps what its benchmark wrote as it went; OUTDIR/suite.json (device name and
# date inside) records every stage's command, budget, exit code and elapsed seconds after each stage.
# Budgets: INSTALL_LIMIT, KERNEL_LIMIT, DECODE_LIMIT, TEST_LIMIT, TRAIN_LIMIT, SERVE_LIMIT (seconds); PYTHON,
# SITE (/tmp/site) and WHEELS (.whl) name the interpreter, the install target and the wheel folder.
set -uo pipefail
usage="usage: bash benchmarks/gpu_suite.sh [--dry-run] [--full] OUTDIR"
DRY=0 FULL=0 OUT=
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY=1 ;;
        --full) FULL=1 ;;
        -h|--help) echo "$usage"; exit 0 ;;
        -*) echo "unknown option $arg; $usage" >&2; exit 2 ;;
        *) [ -z "$OUT" ] || { echo "one OUTDIR only; $usage" >&2; exit 2; }; OUT=$arg ;;
    esac
done
[ -n "$OUT" ] || { echo "$usage" >&2; exit 2; }
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 2
PY=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
WHEELS=${WHEELS:-.whl}
TOTAL_LIMIT=420

STAGES=(install kernels decode tests train serve)
declare -A BUDGET=(
    [install]=${INSTALL_LIMIT:-30} [kernels]=${KERNEL_LIMIT:-105} [decode]=${DECODE_LIMIT:-70}
    [tests]=${TEST_LIMIT:-60} [train]=${TRAIN_LIMIT:-95} [serve]=${SERVE_LIMIT:-60}
)
[ "$FULL" = 1 ] && BUDGET[tests]=${TEST_LIMIT:-300}
total=0
echo "stage budgets (seconds):"
for s in "${STAGES[@]}"; do
    printf '  %-8s %4d\n' "$s" "${BUDGET[$s]}"
    total=$((total + BUDGET[$s]))
done
printf '  %-8s %4d (limit %d)\n' total "$total" "$TOTAL_LIMIT"
if [ "$total" -gt "$TOTAL_LIMIT" ]; then
    if [ "$FULL" = 1 ]; then
        echo "--full: the budgets exceed the 7-minute plan by $((total - TOTAL_LIMIT)) s"
    else
        echo "the stage budgets add up to $total s, over $TOTAL_LIMIT s" >&2
        exit 1
    fi
fi

export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONSAFEPATH=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export TRILM_KERNEL_CACHE="$OUT/kernel_tuning.json"
if [ "$DRY" = 1 ]; then
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
    DEVICE="cpu (dry run)"
else
    export PYTHONPATH="$SITE:$ROOT"
    DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
    DEVICE=${DEVICE:-unknown}
fi
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
SLUG=$(echo "$DEVICE" | tr 'A-Z' 'a-z' | tr -cs 'a-z0-9' '-' | sed 's/-$//')
RECORDS="$OUT/.suite-stages.jsonl"
: > "$RECORDS"

write_json() {  # suite.json from the stage records so far (rewritten after every stage)
    "$PY" - "$OUT/suite.json" "$RECORDS" "$DEVICE" "$DATE" "$DRY" "$FULL" "$total" "$TOTAL_LIMIT" <<'EOF'
import json, os, sys
path, records, device, date, dry, full, total, limit = sys.argv[1:]
stages = [json.loads(line) for line in open(records, encoding="utf-8") if line.strip()]
doc = {"suite": "benchmarks/gpu_suite.sh", "device": device, "date": date,
       "mode": "dry-run" if dry == "1" else "run", "tests": "full" if full == "1" else "fast",
       "budget_total_s": int(total), "budget_limit_s": int(limit),
       "elapsed_total_s": round(sum(s["elapsed_s"] for s in stages), 1), "stages": stages}
tmp = path + ".tmp"
with open(tmp, "w", encoding="utf-8") as f:
    f.write(json.dumps(doc, indent=1) + "\n")
os.replace(tmp, path)
EOF
}

record() {  # NAME BUDGET STATUS EXIT ELAPSED NOTE COMMAND...
    local name=$1 budget=$2 status=$3 rc=$4 elapsed=$5 note=$6
    shift 6
    "$PY" -c 'import json, shlex, sys
n, b, s, rc, el, note, log, *cmd = sys.argv[1:]
print(json.dumps({"name": n, "budget_s": int(b), "status": s, "exit": int(rc), "elapsed_s": float(el),
                  "note": note or None, "log": log, "command": shlex.join(cmd)}))' \
        "$name" "$budget" "$status" "$rc" "$elapsed" "$note" "$name.log" "$@" >> "$RECORDS"
    write_json
}

FAILED=()
run_stage() {  # NAME NOTE COMMAND...: run under the stage's budget (dry run: 120 s), log in OUTDIR/NAME.log
    local name=$1 note=$2
    shift 2
    local budget=${BUDGET[$name]} limit log="$OUT/$name.log" start rc status elapsed
    limit=$([ "$DRY" = 1 ] && echo 120 || echo $((budget - 3)))
    echo "== $name (budget ${budget} s${note:+; $note}): $*"
    start=$(date +%s.%N)
    timeout -k 3 "$limit" "$@" > "$log" 2>&1
    rc=$?
    elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    case $rc in 0) status=ok ;; 124|137) status=timeout ;; *) status=failed ;; esac
    [ "$rc" = 0 ] || FAILED+=("$name")
    record "$name" "$budget" "$status" "$rc" "$elapsed" "$note" "$@"
    echo "-- $name: $status (exit $rc) after $elapsed s"
    tail -n "${TAIL_LINES:-15}" "$log" | grep -v '^\[20' | sed 's/^/   /'
}

skip_stage() {  # NAME REASON
    echo "== $1: skipped ($2)"
    record "$1" "${BUDGET[$1]}" skipped 0 0 "$2"
}

install_script() {  # the install stage as one script (dry run: what can be checked without a GPU)
    # the check runs as python -c '...': no single quote inside it
    local check='import os, sys, torch, triton, transformers, trilm, trilm.kernels, benchmarks.common
print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__,
      "transformers", transformers.__version__, "trilm", trilm.__file__)
site = os.environ.get("SUITE_SITE")
if site and not trilm.__file__.startswith(site + "/"):
    sys.exit(f"trilm comes from {trilm.__file__}, not from the wheel installed in {site}")
from transformers import LlamaForCausalLM  # 5.17 fails here beside a top-level kernels/ folder
try:
    import deepspeed, megatron.core
    print("deepspeed", deepspeed.__version__, "megatron-core", megatron.core.__version__)
except Exception as exc:
    print("no DeepSpeed engine here:", type(exc).__name__, exc)'
    local info="$OUT/gpu-info-$SLUG-${DATE%%T*}.txt"
    echo "set -eo pipefail"
    if [ "$DRY" = 1 ]; then
        echo "bash -n benchmarks/gpu_wheels.sh"
        echo "ls '$WHEELS'/*.whl 2>/dev/null || echo 'no $WHEELS/ here: benchmarks/gpu_wheels.sh fills it'"
        echo "$PY -c '$check'"
    else
        echo "ls '$WHEELS'/*.whl"
        echo "$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\"
        echo "    --target '$SITE' '$WHEELS'/*.whl"
        echo "{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv \\"
        echo "    || echo 'nvidia-smi failed'; } | tee '$info'"
        echo "SUITE_SITE='$SITE' $PY -c '$check' | tee -a '$info'"
    fi
}

DRYARG=()
[ "$DRY" = 1 ] && DRYARG=(--dry-run)
run_stage install "" bash -c "$(install_script)"
case " ${FAILED[*]} " in
    *" install "*) echo "install failed: the stages below run against whatever the machine has" >&2 ;;
esac

seed=
if [ ! -s "$TRILM_KERNEL_CACHE" ] && [ "${SEED_TUNING:-1}" = 1 ]; then
    seed=$(ls -t benchmarks/results/kernel-tuning-"$SLUG"-*.json 2>/dev/null | head -n 1)
    [ -n "$seed" ] && cp "$seed" "$TRILM_KERNEL_CACHE"
fi
run_stage kernels "${seed:+tuning cache seeded from $seed}" "$PY" -m benchmarks.kernels \
    --formats ternary binary int2 int4 --shapes 8192x8192 --batches 1 16 --compare-gemv 2 8 --compare-pairs \
    --spectra-shapes --no-model --out "$OUT" "${DRYARG[@]}"

if [ -f benchmarks/serve/decode.py ]; then
    run_stage decode "" "$PY" -m benchmarks.serve.decode --sizes 1.1b 3.9b --out "$OUT" "${DRYARG[@]}"
else
    skip_stage decode "benchmarks/serve/decode.py does not exist in this checkout"
fi

mapfile -t test_files < <(grep -rlE --include='test_*.py' 'pytest\.mark\.gpu' tests | sort)
marks="gpu and not slow" per_test=45
[ "$FULL" = 1 ] && marks=gpu per_test=180
pytest_args=(-q -p no:cacheprovider -o pythonpath= --import-mode=append -p benchmarks.gpu_pytest)
pytest_args+=(-o "timeout=$per_test" -m "$marks")
[ "$DRY" = 1 ] && pytest_args+=(--collect-only)
TRILM_TEST_LOG="$OUT/gpu-tests.jsonl" run_stage tests "${#test_files[@]} files, -m '$marks'" \
    "$PY" -m pytest "${pytest_args[@]}" "${test_files[@]}"

run_stage train "" "$PY" -m benchmarks.train --engine --contenders compile --size 1.1b --batch 8 \
    --seq 2048 --warmup 3 --steps 5 --timeout 45 --out "$OUT" "${DRYARG[@]}"

run_stage serve "" "$PY" -m benchmarks.serve --device cuda --size 3.9b \
    --contenders floatlm trilm quantlm-int4 --ttft 128 2048 --depths 128 1024 --batches 1 16 \
    --steps 32 --rounds 2 --out "$OUT" "${DRYARG[@]}"

echo
echo "suite: $(date -u +%FT%TZ), results in $OUT (suite.json)"
if [ "${#FAILED[@]}" -gt 0 ]; then
    echo "stages not ok: ${FAILED[*]}" >&2
    exit 1
fi
echo "every stage ok"
