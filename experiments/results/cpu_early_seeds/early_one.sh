#!/bin/bash
# One seed of issue 28 item 5 (ours_commands.sh runs the three): bash early_one.sh SEED
seed=$1
cd /work/studies/frozen_a3c40f6
export F2M_DATA_DIR=/work/shared/data F2M_CACHE_DIR=/tmp/f2mcache_study
W=/work/studies/early/seed$seed
(while [ ! -f $W/config.json ]; do sleep 5; done; python experiments/base_test_curve.py $W --watch 30) > /work/studies/early/curve_seed$seed.log 2>&1 &
watcher=$!
python run.py --config configs/cifar100.py:trainsplit --workdir $W --config.seed=$seed \
  --config.base.steps=1000 "--config.base.milestones=(500,)" --config.base.checkpoint_every=250 \
  --config.runs=1 --config.noise.clean_backward=True > /work/studies/early/run_seed$seed.log 2>&1
echo "seed $seed rc=$?" >> /work/studies/early/status.txt
sleep 60; kill $watcher
