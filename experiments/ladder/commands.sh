#!/usr/bin/env bash
# Every command behind docs/results/ladder/, in the order they were run, from the repository root. Each training
# runs one thread (OMP_NUM_THREADS=1); the runs were spread over two or three such processes side by side, at nice
# 19, on a 2-core machine shared with other jobs (docs/results/ladder/README.md has the wall times). Finished runs
# are skipped on a rerun, so this script resumes where it stopped.
set -euo pipefail
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false

# 0. The embedded corpus, tokenized once (vocabulary 2,048): shared by the pilots, the ladder and the μP check.
trilm data embedded --out runs/ladder/data --vocab-size 2048
mkdir -p runs/ladder-mup && ln -sfn ../ladder/data runs/ladder-mup/data

# 1. What a budget buys: CPU time per step by size and batch, one thread; and one thread against two.
python -m benchmarks.train.batch_throughput --shapes 64x2,96x3,128x4,192x4,256x6 --batches 4,8,16,32,64 \
    --rounds 3 --steps 2 --out runs/pilots
python -m benchmarks.train.batch_throughput --shapes 64x2,128x4 --batches 8 --rounds 3 --steps 3 --threads 1 \
    --out runs/pilots/threads1
OMP_NUM_THREADS=2 python -m benchmarks.train.batch_throughput --shapes 64x2,128x4 --batches 8 --rounds 3 --steps 3 \
    --threads 2 --out runs/pilots/threads2

# 2. Pilot 1: batch size x peak rate, FloatLM, 1,048,576 tokens, 5% warm-up (the old recipe's), width 128 and 64.
#    The pairs below are the ones run (the rest of the grid was dropped once the trend was clear; pilots.md).
pilot() {  # hidden layers ffn heads batch lr
  local h=$1 l=$2 f=$3 nh=$4 batch=$5 lr=$6 seqs=$(($5 / 128)) steps=$((1048576 / $5))
  local mb=$((seqs < 32 ? seqs : 32))
  trilm train --config configs/train/quickstart-floatlm.yaml run_dir=runs/pilots/p1/floatlm-${h}x${l}-b${batch}-lr${lr} \
    model.hidden=$h model.layers=$l model.ffn=$f model.heads=$nh model.context=128 seq_len=128 tokens=1048576 \
    batch_tokens=$batch micro_batch=$mb optim.lr=$lr schedule.warmup=0.05 data.train_dir=runs/ladder/data/train \
    data.valid_dir=runs/ladder/data/validation data.tokenizer=runs/ladder/data/tokenizer.model \
    data.valid_sequences=256 checkpoint.snapshot_every=$((steps / 4)) checkpoint.state_every=$((steps / 4)) \
    checkpoint.log_spaced_until=16 log.every=10 log.progress=false log.tensorboard=false
}
for lr in 2e-3 4e-3 8e-3; do pilot 128 4 384 4 1024 $lr; done
for lr in 2e-3 4e-3; do pilot 128 4 384 4 2048 $lr; done
pilot 128 4 384 4 4096 4e-3
for lr in 4e-3 8e-3; do pilot 64 2 192 2 1024 $lr; done

# 3. Pilots through the ladder's own runs (configs/suites/ladder.yaml) on 1,048,576 tokens: batch 512, warm-up,
#    and batch 4,096 with the longer warm-up. They ran before the ladder took its 15% warm-up, hence the
#    explicit 5% where the pilot used it.
P="trilm suite sweep ladder --families floatlm --size 128x4 --tokens 1048576 --no-progress"
$P --lr 2e-3,4e-3 --set batch_tokens=512 --set schedule.warmup=0.05
$P --lr 4e-3 --set schedule.warmup=0.01,0.15,0.3
$P --lr 2e-3 --set schedule.warmup=0.15
$P --lr 4e-3,8e-3 --set batch_tokens=4096 --set schedule.warmup=0.15
python -m experiments.ladder.pilots runs/pilots/p1 runs/ladder/sweep --out docs/results/ladder

# 4. The ladder: every family at every size and rate, on the full budget (2,097,152 tokens), then the best rate
#    of each (family, size) is the ladder's run (adopt.py prints them; `adopt.py --copy` puts them where
#    `trilm suite launch/status ladder` look for them). The queue that actually ran them, one (family, size,
#    rate) per command, two or three at a time, is this same command with one --families/--size/--lr each.
S="trilm suite sweep ladder --families trilm,floatlm,bilm --no-progress --jobs 2"
$S --size 192x4,128x4,96x3,64x2 --lr 1e-3,2e-3,4e-3
$S --size 32x2 --lr 1e-3,2e-3,4e-3,8e-3
$S --size 96x3,64x2 --lr 8e-3                 # the rate grid widened where 4e-3 was best or nearly
trilm suite sweep ladder --families trilm --size 96x3 --lr 1.6e-2 --no-progress
python -m experiments.ladder.adopt          # prints the best rate of each (family, size)
# The report: the best rate of each (family, size) through `trilm suite analyse`'s analysis (bootstrap 1000,
# seed 0) → README.md, analysis/, sweeps.png, mup.png. Rerun whenever more runs have finished.
python -m experiments.ladder

# 5. Does a rate carry over across widths? FloatLM at depth 4, widths 64/128/192: the standard parametrization
#    (128x4 and 192x4 are the ladder's own FloatLM runs above) and μP with base width 64.
M="trilm suite sweep ladder-mup --no-progress --jobs 2"
$M --size 64x4 --lr 1e-3,2e-3,4e-3
$M --size 192x4,128x4 --lr 1e-3,2e-3,4e-3 --set model.mup_base_width=64

# 6. A build step, not a measurement: the best-rate finals as trilm's package data
#    (configs/reference/ladder-finals.json, which `trilm quickstart` compares its family order with).
make reference-data
