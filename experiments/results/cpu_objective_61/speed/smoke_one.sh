#!/bin/bash
# usage: smoke_one.sh REPO TAG -- the whole cifar100 smoke run in a fresh workdir (kept: OUT/smoke_TAG_<n>)
out=/work/smoke/issue61c_speed/smoke_$2_$(date +%s%N)
cd "$1" && F2M_DATA_DIR=/work/shared/data F2M_CACHE_DIR=/work/cache_issue61c_speed python run.py --config configs/cifar100.py:smoke --workdir "$out" > "$out.log" 2>&1
