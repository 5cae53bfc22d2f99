#!/usr/bin/env bash
# Issue 44's bench figures: --mode bench of two checkouts alternating OLD NEW for ROUNDS rounds on
# CONFIG (default configs/cifar100.py:smoke): the per-step table at M = 2 in float32 (unrolled draws,
# the CPU's) and the member table at S = 1, 2, 4 (members unrolled). EXTRA adds flags to both.
#   experiments/results/cpu_one_program/bench.sh OLD_CHECKOUT NEW_CHECKOUT OUT [ROUNDS]
set -euo pipefail
old=$1; new=$2; out=$3; rounds=${4:-2}
config=${CONFIG:-configs/cifar100.py:smoke}
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for pair in "old:$old" "new:$new"; do
    label=${pair%%:*}; src=${pair#*:}
    w="$out/bench_${label}_$r"
    rm -rf "$w"
    (cd "$src" && python3 run.py --config "$config" --mode bench --workdir "$w" "--config.bench.M_list=(2,)" \
        "--config.bench.dtypes=('float32',)" "--config.bench.member_sizes=(1,2,4)" \
        --config.bench.iters=7 ${EXTRA:-} > "$w.log" 2>&1)
    python3 - "$w" "$label" "$r" >> "$out/bench.jsonl" <<'PY'
import glob, json, sys
w, label, rnd = sys.argv[1:]
doc = json.load(open(sorted(glob.glob(w + '/bench*.json'))[-1]))
ms = {r['variant']: r['step_ms_median'] for r in doc['records']}
members = {r['M']: r['step_ms_median'] for r in doc['members']}
print(json.dumps({'code': label, 'round': int(rnd), 'plain_ms': ms['plain'], 'f2m_shared_ms': ms['f2m_shared'],
                  'shared_over_plain': round(ms['f2m_shared'] / ms['plain'], 3),
                  'members_ms_per_call': members,
                  'members_x_single': {s: round(s * members[1] / t, 3) for s, t in members.items()}}))
PY
  done
done
cat "$out/bench.jsonl"
