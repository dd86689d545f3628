#!/usr/bin/env bash
# The ternarization experiment (docs/results/ternarize/README.md): every run, then the report. An interrupted
# run keeps its CSV (results.csv, crossover.csv) and a rerun trains only what is missing.
set -euo pipefail

# Which share f to convert, at D = 524,288 tokens: two runs at a time, one thread each (2.26 h of run time).
python -m experiments.ternarize --sizes 64x2 128x4 --seeds 1 2 3 --tokens 524288 --jobs 2

# The crossover: the gap against tokens per parameter D/N. One run at a time, in process (the machine had 2
# cores shared with 5 other developers), the cheapest ready run first: the 16x2 rate sweep, the recipe sweep
# at 16x2 D/N = 50, then every point by its budget. Started 2026-12-06 13:47 UTC in the background:
#   OMP_NUM_THREADS=1 setsid nohup python -m experiments.ternarize crossover ... >> runs/ternarize-crossover/driver.log 2>&1 &
# The same command resumes it (it trains only the runs crossover.csv lacks).
OMP_NUM_THREADS=1 python -m experiments.ternarize crossover --sizes 16x2 32x2 --dn 5 15 50 150 500 --seeds 1 2 3 --jobs 1

python -m experiments.ternarize.report
