#!/usr/bin/env bash
# The ternarization experiment (docs/results/ternarize/README.md): every run, then the report.
# Two runs at a time, one thread each; an interrupted run keeps results.csv and trains only what is missing.
set -euo pipefail
python -m experiments.ternarize --sizes 64x2 128x4 --seeds 1 2 3 --tokens 524288 --jobs 2
python -m experiments.ternarize.report
