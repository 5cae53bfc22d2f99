#!/bin/bash
# usage: bench_one.sh REPO TAG -- one `--mode bench` of the smoke config (plain and F2M at M = 2, 4), kept in OUT/TAG_<n>
out=/work/smoke/issue61c_speed/bench_$2_$(date +%s%N)
cd "$1" && F2M_DATA_DIR=/work/shared/data F2M_CACHE_DIR=/work/cache_issue61c_speed python run.py --config configs/cifar100.py:smoke --mode bench \
  --workdir "$out" "--config.bench.M_list=(2,4)" "--config.bench.member_sizes=()" --config.bench.whole_run_steps=0 > "$out.log" 2>&1
