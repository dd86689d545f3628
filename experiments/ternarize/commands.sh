#!/usr/bin/env bash
# The ternarization experiment (docs/results/ternarize/README.md): every run, then the report. An interrupted
# run keeps its CSV (results.csv, crossover.csv) and a rerun trains only what is missing.
set -euo pipefail

# Which share f to convert, at D = 524,288 tokens: two runs at a time, one thread each (2.26 h of run time).
python -m experiments.ternarize --sizes 64x2 128x4 --seeds 1 2 3 --tokens 524288 --jobs 2

# The crossover: the gap against tokens per parameter D/N. One run at a time, in process, the cheapest ready
# run first: the 16x2 rate sweep, the recipe sweep at 16x2 D/N = 50, then every point by its budget.
# 2026-12-06, 13:44-15:44 UTC in the background on a 2-core machine shared with 5 other developers:
# 302 runs, 1.90 h of run time (the seconds column of crossover.csv), every point of 16x2 (D/N 5-500) and
# of 32x2 up to D/N = 50; then 16:37-18:20 UTC, beside other training jobs, 32x2 at D/N = 150 (30 runs,
# 3 seeds; this command with --dn 5 15 50 150); then 19:42-21:20 UTC, beside a quickstart and fits, 32x2 at
# D/N = 500, seed 1 (10 runs, 1.53 h; --sizes 32x2 --dn 500 --seeds 1). Still missing: its seeds 2 and 3
# (76M tokens per seed, some 50 minutes per seed at 25k tokens/s on an idle core). This command resumes
# them, training only the runs crossover.csv lacks (the run directories under runs/ternarize-crossover are
# not kept; the sources of the missing points are not either, so each point trains from its start):
OMP_NUM_THREADS=1 python -m experiments.ternarize crossover --sizes 16x2 32x2 --dn 5 15 50 150 500 --seeds 1 2 3 --jobs 1

python -m experiments.ternarize.report
