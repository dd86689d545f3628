#!/usr/bin/env bash
# Every command behind docs/results/forecast-untuned/, from the repository root, in the order they ran. Each
# training run is one thread; finished runs and branches are skipped on a rerun.
set -euo pipefail
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false

# 1. forecast-long: TriLM and FloatLM at 32x2 and 64x2 for 8,388,608 tokens each, one after another, then their
#    cooldown branches ending at 1/8 of the budget.
trilm suite launch forecast-long --local --jobs 1
trilm suite cooldown forecast-long --jobs 1
# 2. forecast-large: TriLM and FloatLM at 192x4 for 2,097,152 tokens each, then their branches at 1/8.
trilm suite launch forecast-large --local --jobs 1
trilm suite cooldown forecast-large --jobs 1
# 3. The runs' curves as tables (docs/results/forecast-untuned/curves/, runs.json); the run directories are not
#    kept.
python -m experiments.forecast_untuned collect
# 4. The forecasts from 25 % and 50 % of every run, with trilm's defaults: forecasts.json, README.md,
#    forecasts.png.
python -m experiments.forecast_untuned report
