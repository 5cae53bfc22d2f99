#!/bin/bash
# Seeds given as arguments, run side by side, one thread each; stdout/stderr + wall time per run under logs/.
cd /work/oracle/authors/F2M
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TORCH_THREADS=1
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
