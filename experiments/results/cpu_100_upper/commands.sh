#!/usr/bin/env bash
# Issue 13: the upper table on the main trainsplit split at the CPU budget (100 iterations).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"  # ran from a frozen copy of the commit
export F2M_DATA_DIR="${F2M_DATA_DIR:?set it to the folder holding cifar100_train.npz}" F2M_CACHE_DIR="${F2M_CACHE_DIR:-/tmp/f2mcache_study}"
out="${OUT:-runs/main_upper}"
cfg=configs/cifar100.py:trainsplit
common=(--config.base.steps=100 "--config.base.milestones=(50,)" --config.crt.epochs=2 "--config.crt.milestones=(1,)")
run() { local name=$1 runs=$2; shift 2; echo "=== $name $(date -u +%FT%T)"; python run.py --config "$cfg" --workdir "$out/$name" "${common[@]}" --config.runs="$runs" "$@"; echo "=== done $name $(date -u +%FT%T)"; }
run f2m 2
run baseline 2 --config.method=baseline
run joint 1 --config.method=joint
run crt 1 --config.method=crt --checkpoint "$out/joint"
