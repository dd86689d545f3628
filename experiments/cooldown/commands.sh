#!/usr/bin/env bash
# Every command behind docs/results/cooldown/, from the repository root. Each training run is one thread; finished
# runs and branches are skipped on a rerun, so this script resumes where it stopped.
set -euo pipefail
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false

# 1. The WSD runs (12: three families x four sizes, 2,097,152 tokens each), keeping the states the branches start from.
trilm suite launch cooldown --local --jobs 2
# 2. Their cooldown branches at 1/8, 1/4, 3/8, 1/2 and 3/4 of the budget (each trains only its cooldown).
trilm suite cooldown cooldown --jobs 2
# 3. Fresh runs to half the budget on each family's own decaying schedule, for the equal-compute comparison.
trilm suite launch cooldown-fresh --local --jobs 2
# 4. Fit on the branches at <= 1/2 of the budget, predict the rest, compare, write README.md and predictions.json.
python -m experiments.cooldown report
# 5. Every L(N, D) law of trilm.scaling.laws on the same split, and the law each family chooses: laws.md, laws.json.
python -m experiments.cooldown.laws
# 6. Every run's final loss forecast from its first 25 % and 50 % of checkpoints, each model alone and the
#    suite jointly: Tissue's law (C shared), then with its momentum λ fitted (alone; C and λ shared; λ
#    shared; λ shared and C a power of size, trilm suite status's default): forecasts.md, forecasts.json
#    (20 refits per fit: a joint refit costs ~2 CPU-s; 2026-12-06, 36 min beside two training jobs).
python -m experiments.cooldown.forecasts --bootstrap 20 --variants alone "joint, C shared" "λ fitted, alone" \
    "λ fitted, joint, C and λ shared" "λ fitted, joint, λ shared" "λ fitted, joint, λ shared, C ∝ N^k"
# 7. The same with Luo et al.'s multi-power law, the shape of its drop shared across each suite (tried after
#    docs/results/forecast-untuned/ showed the default's errors): multipower/forecasts.md, forecasts.json.
python -m experiments.cooldown.forecasts --bootstrap 20 --variants "multi-power, joint, drop shared" --out docs/results/cooldown/multipower
# (The runs are not committed; the results tables beside the report are: rewrite it from them with
#  python -m experiments.cooldown report --from-tables)
