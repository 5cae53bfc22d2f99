#!/bin/bash
# The flatness of the two full-budget base models (issue 30 item 3), on the CPU with section 5's subsets:
# uniform noise on the noise set, b = 0.005 (the training bound) with 250 draws on 2,000 seeded base
# training and 2,000 base test images, and b = 0.05 with 100 draws on 1,000 + 1,000. From the repo root:
#   experiments/results/h200_full_budget/flatness.sh [MODEL...]   # default: f2m_full baseline_full
set -euo pipefail
R=experiments/results/h200_full_budget
for model in ${@:-f2m_full baseline_full}; do
  for spec in "0.005 250 2000" "0.05 100 1000"; do
    read -r b n imgs <<< "$spec"
    W=$R/flatness/${model}_b$b
    [ -f $W/flatness.json ] && continue
    python run.py --config configs/cifar100.py:trainsplit --mode flatness --workdir $W --checkpoint $R/$model \
        --config.noise.distribution=uniform --config.noise.std_weight=0.0 --config.flatness.bound=$b \
        --config.flatness.num_draws=$n --config.flatness.max_images=$imgs
  done
done
