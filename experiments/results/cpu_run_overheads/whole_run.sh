#!/bin/bash
# The whole-run figures of section 21: `--mode bench`'s whole runs only (F2M and the Baseline through
# the pipeline, 4 base steps, 1 run of sessions) of configs/cifar100.py on random data, from the
# repository root of the tree to time; LABEL names the output folder. Extra flags (e.g.
# --config.compile_ahead=on) go to run.py.
#   experiments/results/cpu_run_overheads/whole_run.sh OUT LABEL [flags]
set -euo pipefail
out=$1; label=$2; shift 2
python3 run.py --config configs/cifar100.py --mode bench --workdir "$out/$label" \
  --config.bench.backend_defaults=False "--config.bench.dtypes=()" "--config.bench.member_sizes=()" \
  --config.bench.whole_run_steps=4 --config.bench.whole_run_runs=1 "$@" > "$out/$label.log" 2>&1
