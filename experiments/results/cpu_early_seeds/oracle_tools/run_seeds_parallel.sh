#!/bin/bash
# Seeds given as arguments, run side by side, TORCH_THREADS threads each (default 1); stdout/stderr + wall time per run under logs/.
cd /work/oracle/authors/F2M
export TORCH_THREADS=${TORCH_THREADS:-1}
export OMP_NUM_THREADS=$TORCH_THREADS MKL_NUM_THREADS=$TORCH_THREADS
for s in "$@"; do
  (
    echo "seed $s start $(date -Is)" >> ../logs/driver.log
    t0=$(date +%s)
    ../venv/bin/python train.py -opt ../configs/F2M_trainsplit_it1002_seed$s.yml > ../logs/seed${s}_stdout.log 2>&1
    rc=$?
    t1=$(date +%s)
    echo "seed $s end $(date -Is) rc=$rc wall_s=$((t1-t0))" >> ../logs/driver.log
  ) &
done
wait
