#!/usr/bin/env bash
# Seed sweeps on one GPU: S members in one program against single runs and against separate
# processes sharing the GPU (docs/performance.md, "Seeds and sweeps in one program"). No data needed.
#   1. `members`: the member table (experiments/bench_members.py), S in MEMBER_SIZES (default 1 2 4 8)
#      at M = 2, in float32 and bfloat16, for each members.map in MAPS (default "unroll vmap"): each S's
#      member-steps/s against S times one run's, in one run.
#   2. `procs`: PROCS (default 8) processes at once, each timing one run's F2M program
#      (experiments/bench_members.py --sizes 1) while they share the GPU (its multi-process service is started where
#      `nvidia-cuda-mps-control` exists); their summed steps/s is the comparator for S = PROCS.
#   3. `profile`: 30 base steps of one run (3 calls of 10 scanned steps, the images on the device)
#      traced with jax.profiler: kernels per step and the GPU's idle share
#      (experiments/profile_steps.py; OUT/profile/profile.json and the trace).
# For the whole full-budget run with a cold and a warm compilation cache (a second device call):
#   PARTS="full repeat" experiments/gpu_targets.sh OUT
#
#   experiments/gpu_members.sh OUT
#   CONFIG=configs/cifar100.py:smoke ITERS=1 MEMBER_SIZES="1 2" PROCS=2 experiments/gpu_members.sh OUT
#     (the CPU check of this script)
set -euo pipefail
out=${1:?usage: experiments/gpu_members.sh OUT}
parts=" ${PARTS:-members procs profile} "
sizes=${MEMBER_SIZES:-1 2 4 8}
maps=${MAPS:-unroll vmap}
procs=${PROCS:-8}
iters=${ITERS:-5}
py=${PYTHON:-python3}
config=${CONFIG:-configs/cifar100.py}
mkdir -p "$out"
common=(experiments/bench_members.py --config "$config" --iters "$iters" --M 2)
if [[ $parts == *" members "* ]]; then
  for dtype in float32 bfloat16; do
    for map in $maps; do
      $py "${common[@]}" --out "$out/members_${dtype}_$map" --dtype "$dtype" --map "$map" --sizes $sizes \
          2>&1 | tee "$out/members_${dtype}_$map.log"
    done
  done
fi
if [[ $parts == *" procs "* ]]; then
  mps=0
  mkdir -p "$out/procs"
  if command -v nvidia-cuda-mps-control > /dev/null; then
    nvidia-cuda-mps-control -d && mps=1 || true
  fi
  for i in $(seq 1 "$procs"); do
    XLA_PYTHON_CLIENT_MEM_FRACTION=$(awk "BEGIN {print 0.9 / $procs}") \
      $py "${common[@]}" --out "$out/procs/p$i" --sizes 1 > "$out/procs/p$i.log" 2>&1 &
  done
  wait
  [ "$mps" = 1 ] && echo quit | nvidia-cuda-mps-control || true
  $py - "$out/procs" "$procs" "$mps" <<'EOF'
import glob, json, sys
rows = []
for path in sorted(glob.glob(sys.argv[1] + '/p*/members.json')):
  rec = [r for r in json.load(open(path))['records'] if r['M'] == 1][0]
  rows.append(rec['step_ms_median'])
print(json.dumps({'processes': int(sys.argv[2]), 'mps': sys.argv[3] == '1', 'step_ms_median': rows,
                  'summed_steps_per_s': round(sum(1e3 / ms for ms in rows), 2)}))
EOF
fi
if [[ $parts == *" profile "* ]]; then
  $py experiments/profile_steps.py --config "$config" --out "$out/profile" --calls 3 --steps_per_call 10 \
      2>&1 | tee "$out/profile.log"
fi
