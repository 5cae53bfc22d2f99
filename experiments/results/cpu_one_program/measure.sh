#!/usr/bin/env bash
# Issue 44's CPU figures: the smoke run (configs/cifar100.py:smoke) of two checkouts, alternating
# OLD NEW OLD NEW ... for ROUNDS rounds; per checkout and round one run with a cold compilation cache
# (a new cache folder) and one warm (the same folder again). Writes OUT/runs.jsonl: per run its
# wall time (the process), the time from the process start to the first logged base step (step 10)
# and to the end of base training (the last base line), read from metrics.jsonl.
#   experiments/results/cpu_one_program/measure.sh OLD_CHECKOUT NEW_CHECKOUT OUT [ROUNDS]
set -euo pipefail
old=$1; new=$2; out=$3; rounds=${4:-3}
mkdir -p "$out"
one() {  # checkout label round cache: one smoke run, one line of runs.jsonl
  local src=$1 label=$2 round=$3 cache=$4 temp=$5
  local w="$out/w_${label}_${round}_${temp}"
  rm -rf "$w"
  local t0; t0=$(python3 -c 'import time; print(time.time())')
  (cd "$src" && F2M_CACHE_DIR="$cache" python3 run.py --config configs/cifar100.py:smoke --workdir "$w" \
      --config.tensorboard=False > "$w.log" 2>&1)
  python3 - "$w" "$t0" "$label" "$round" "$temp" >> "$out/runs.jsonl" <<'PY'
import json, sys, time
w, t0, label, rnd, temp = sys.argv[1], float(sys.argv[2]), *sys.argv[3:]
rows = [json.loads(l) for l in open(w + '/metrics.jsonl')]
base = [r for r in rows if r.get('phase') == 'base']
print(json.dumps({'code': label, 'round': int(rnd), 'cache': temp, 'wall_s': round(time.time() - t0, 2),
                  'start_to_step_10_s': round(base[0]['time'] - t0, 2),
                  'start_to_base_end_s': round(base[-1]['time'] - t0, 2)}))
PY
}
for r in $(seq 1 "$rounds"); do
  for pair in "old:$old" "new:$new"; do
    label=${pair%%:*}; src=${pair#*:}
    cache=$(mktemp -d)
    one "$src" "$label" "$r" "$cache" cold
    one "$src" "$label" "$r" "$cache" warm
    rm -rf "$cache"
  done
done
cat "$out/runs.jsonl"
