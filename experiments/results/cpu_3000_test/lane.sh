#!/bin/bash
# Issue 29 item 3: rows of the test table at the fixed budget (3,000 iterations, 10 draws). Rerun to resume.
# bash lane.sh LANE_NAME ROW...
lane=$1; shift
cd /work/studies/frozen_3efa2a0
export F2M_DATA_DIR=/work/shared/data F2M_CACHE_DIR=/tmp/f2mcache_study
STEPS=3000 experiments/validation_search.sh test /work/studies/test3000 "$@" >> /work/studies/test3000/$lane.log 2>&1
echo "$lane rc=$? $(date -Is)" >> /work/studies/test3000/status.txt
