#!/usr/bin/env bash
# The frictions of issue 46 and the faults of issue 48, each tried as its command, on one checkout.
# usage: frictions.sh CHECKOUT OUT   (run it once per commit; OUT/cases.tsv: case, exit code,
# seconds, the workdir's files afterwards, the output's last line; OUT/<case>.log: the whole output)
# Needs F2M_DATA_DIR (the CIFAR-100 training set, for the offline case it is unset on purpose).
set -u
src=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd)
cd "$src"
export F2M_CACHE_DIR=$out/cache
SMOKE="--config configs/cifar100.py:smoke --config.tensorboard=False"
printf 'case\trc\tseconds\tworkdir_after\tlast_line\n' > "$out/cases.tsv"

files() { if [ -e "$1" ]; then (cd "$1" 2>/dev/null && ls -1 | tr '\n' ' ') || echo "(a file)"; else echo '(none)'; fi; }
case_() {  # case_ NAME WORKDIR TIMEOUT COMMAND...: runs the command, records what it left
  local name=$1 wd=$2 limit=$3; shift 3
  local start=$(date +%s.%N)
  { echo "\$ $*"; timeout -s INT "$limit" "$@"; } > "$out/$name.log" 2>&1
  local rc=$?
  local secs=$(python3 -c "import time; print(round(time.time() - $start, 1))")
  local last=$(grep -v '^\s*$' "$out/$name.log" | tail -1 | cut -c1-300 | tr '\t' ' ')
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$secs" "$(files "$wd")" "$last" >> "$out/cases.tsv"
  echo "$name rc=$rc ${secs}s: $last"
}
flip() {  # flip STEP_DIR: XOR 4 KiB in the middle of its largest file (bytes a disk or a copy could spoil)
  python3 - "$1" <<'EOF'
import os, sys
files = [os.path.join(d, f) for d, _, fs in os.walk(sys.argv[1]) for f in fs]
path = max(files, key=os.path.getsize)
data = bytearray(open(path, 'rb').read())
mid = len(data) // 2
data[mid:mid + 4096] = bytes(b ^ 0x5A for b in data[mid:mid + 4096])
open(path, 'wb').write(data)
print('flipped', path, len(data))
EOF
}
fresh() { rm -rf "$out/w/$1"; mkdir -p "$out/w"; echo "$out/w/$1"; }
copy() { local w=$(fresh "$1"); cp -r "$out/ref" "$w"; echo "$w"; }

# A finished smoke run the fault cases copy.
rm -rf "$out/ref"
case_ reference "$out/ref" 600 python run.py $SMOKE --workdir "$out/ref"

# ---- issue 46: checks after writes, and the corrected command refused
w=$(fresh topic); case_ 46.1a_topic_on_synthetic "$w" 300 python run.py $SMOKE --config.data.protocol=topic --workdir "$w"
w=$(fresh minival); case_ 46.1b_mini_validation "$w" 300 python run.py --config configs/mini.py:smoke --config.tensorboard=False --config.data.protocol=validation --workdir "$w"
case_ 46.1b_then_batch_16 "$w" 300 python run.py --config configs/mini.py:smoke --config.tensorboard=False --config.data.protocol=validation --config.base.batch_size=16 --config.base.steps=20 --workdir "$w"
w=$(fresh batch5000); case_ 46.1c_batch_5000 "$w" 300 python run.py $SMOKE --config.base.batch_size=5000 --workdir "$w"
# ---- 2. Ctrl-C after the first logged base step, then the same command
w=$(fresh sigint)
( python run.py $SMOKE --workdir "$w" > "$out/46.2_sigint.log" 2>&1; echo "rc=$?" >> "$out/46.2_sigint.log" ) &
pid=$!  # Ctrl-C once the first base line is logged
for i in $(seq 3000); do grep -qs '"phase": "base"' "$w/metrics.jsonl" && break; sleep 0.1; done
pkill -INT -f -- "--workdir $w"; wait $pid
printf '%s\t%s\t%s\t%s\t%s\n' 46.2_sigint "$(tail -1 "$out/46.2_sigint.log")" - "$(files "$w")" \
  "$(grep -v '^\s*$' "$out/46.2_sigint.log" | grep -v '^rc=' | tail -1 | cut -c1-300)" >> "$out/cases.tsv"
case_ 46.2_then_same_command "$w" 600 python run.py $SMOKE --workdir "$w"
python3 - "$w/metrics.jsonl" >> "$out/46.2_then_same_command.log" <<'EOF'
import collections, json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = collections.Counter((r.get('phase'), r.get('run'), r.get('session'), r.get('step')) for r in rows)
print('metrics.jsonl lines logged twice:', sum(c - 1 for c in keys.values() if c > 1))
EOF
# ---- 3, 6. a sweep over a field; eval of it
w=$(fresh sweep); case_ 46.3_bound_sweep "$w" 900 python run.py $SMOKE --config.members.field=noise.bound "--config.members.field_values=(0.0025,0.005,0.01)" --workdir "$w"
case_ 46.6_eval_of_the_sweep "$w" 600 python run.py $SMOKE --config.members.field=noise.bound "--config.members.field_values=(0.0025,0.005,0.01)" --workdir "$w" --mode eval
# ---- 4. the report
case_ 46.4a_report_without_out "$out/ref" 120 python -m f2m_jax.report "$out/ref"
case_ 46.4b_report_of_a_sweep_folder "$w" 120 python -m f2m_jax.report "$w"
v=$(fresh validation); case_ 46.4c_validation_run "$v" 600 python run.py $SMOKE --config.data.protocol=validation --workdir "$v"
case_ 46.4c_report_draws_against_validation "$v" 120 python -m f2m_jax.report "$out/ref" "$v"
# ---- 5. a workdir or --out that is a file
mkdir -p "$out/w"; rm -rf "$out/w/afile"; echo x > "$out/w/afile"
case_ 46.5a_workdir_is_a_file "$out/w/afile" 120 python run.py $SMOKE --workdir "$out/w/afile"
case_ 46.5b_report_out_is_a_file "$out/w/afile" 120 python -m f2m_jax.report "$out/ref" --out "$out/w/afile"
# ---- 7. offline CIFAR-100 and make_trainsplit without $F2M_DATA_DIR
w=$(fresh offline); case_ 46.7a_offline_cifar "$w" 300 env F2M_DATA_DIR="$out/no_data_here" python run.py --config configs/cifar100.py --workdir "$w"
case_ 46.7b_make_trainsplit_unset "$out/none" 120 env -u F2M_DATA_DIR sh -c 'python -m f2m_jax.data.make_trainsplit --out $F2M_DATA_DIR'
# ---- 8. a dry run; data.split on synthetic data
w=$(fresh dry); case_ 46.8a_dry_run "$w" 120 python run.py $SMOKE --dry-run --workdir "$w"
w=$(fresh split); case_ 46.8b_superclass_split "$w" 300 python run.py $SMOKE --config.data.split=superclass1 --workdir "$w"

# ---- issue 44, item 6: the sweeps' checks and records (20 base steps: only the records matter)
SHORT="--config.base.steps=20 --config.base.milestones=(15,) --config.base.log_every=10 --config.base.checkpoint_every=10"
w=$(fresh sweep_vamp); case_ 44.6.1_sweep_draw_map_vamp "$w" 300 python run.py $SMOKE $SHORT "--config.members.seeds=(0,1)" --config.noise.draw_map=vamp --workdir "$w"
w=$(fresh sweep_vmap_field); case_ 44.6.2_vmap_members_over_a_field "$w" 600 python run.py $SMOKE $SHORT --config.members.map=vmap --config.members.field=noise.bound "--config.members.field_values=(0.0025,0.005)" --workdir "$w"
w=$(fresh sweep_eval_new); case_ 44.6.3_sweep_eval_on_a_new_folder "$w" 300 python run.py $SMOKE "--config.members.seeds=(0,1)" --mode eval --workdir "$w"
w=$(fresh sweep_baseline); case_ 44.6.4_baseline_sweep "$w" 600 python run.py $SMOKE $SHORT --config.method=baseline "--config.members.seeds=(0,1)" --workdir "$w"
python3 - "$w" "$out/ref" >> "$out/44.6.4_baseline_sweep.log" <<'EOF'
import json, os, sys
for name in ('config.json', 'summary.json', 'member_0/config.json'):
  path = os.path.join(sys.argv[1], name)
  if os.path.exists(path):
    c = json.load(open(path)); c = c.get('provenance', {}).get('config', c)
    print(name, 'records noise.enabled =', c.get('noise', {}).get('enabled'))
c = json.load(open(os.path.join(sys.argv[2], 'config.json')))
print("the reference run's config.json records noise.draw_map =", c['noise'].get('draw_map'),
      '| members.map =', c.get('members', {}).get('map'), '| model.conv_backward =', c['model'].get('conv_backward'))
EOF

# ---- issue 48
w=$(copy flip_run0); flip "$w/checkpoints/run_0/5" > "$out/48.1a.flip"
case_ 48.1a_eval_flipped_run_0_5 "$w" 600 python run.py $SMOKE --workdir "$w" --mode eval
w=$(copy flip_model); flip "$w/checkpoints/model/0" > "$out/48.1b.flip"
case_ 48.1b_eval_flipped_model_0 "$w" 600 python run.py $SMOKE --workdir "$w" --mode eval
w=$(fresh diverge); case_ 48.2_diverged_session "$w" 600 python run.py $SMOKE --checkpoint "$out/ref" --config.incremental.lr=1e30 --config.incremental.clamp=False --workdir "$w"
w=$(copy unwritable); rm -rf "$w/results.json" "$w/results.csv" "$w/checkpoints/run_1"; echo x > "$w/checkpoints/run_1"
case_ 48.3_run_1_is_a_file "$w" 240 python run.py $SMOKE --workdir "$w"
w=$(copy no_config); rm -rf "$w/config.json" "$w/results.json" "$w/results.csv" "$w/checkpoints/run_0" "$w/checkpoints/run_1"
case_ 48.4_no_config_json_other_config "$w" 600 python run.py $SMOKE --config.noise.M=4 --config.base.lr=0.05 --workdir "$w"
for fv in base.batch_size=0 base.log_every=0 eval.batch_size=0 data.shots=100 data.synthetic.train_per_class=0 \
          noise.num_layers=0 base.momentum=-1 base.weight_decay=-0.1; do
  w=$(fresh "bad_${fv%%=*}"); case_ "48.5_${fv}" "$w" 600 python run.py $SMOKE "--config.$fv" --workdir "$w"
done
w=$(fresh other_base); case_ 48.5_checkpoint_with_20_base_classes_from_30 "$w" 600 python run.py $SMOKE --config.data.synthetic.num_base=30 --checkpoint "$out/ref" --workdir "$w"
# ---- 6. two processes on one workdir; an invalid config.json; results.csv missing; a file for tensorboard
w=$(fresh twice)
( python run.py $SMOKE --workdir "$w" > "$out/48.6a_first.log" 2>&1; echo "rc=$?" >> "$out/48.6a_first.log" ) &
sleep 3; case_ 48.6a_second_process "$w" 600 python run.py $SMOKE --workdir "$w"; wait
python3 - "$w/metrics.jsonl" >> "$out/48.6a_second_process.log" <<'EOF'
import collections, json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = collections.Counter((r.get('phase'), r.get('run'), r.get('session'), r.get('step')) for r in rows)
print('metrics.jsonl lines logged twice:', sum(c - 1 for c in keys.values() if c > 1))
EOF
w=$(copy bad_json); echo '{"method": "f2m",' > "$w/config.json"
case_ 48.6b_invalid_config_json "$w" 120 python run.py $SMOKE --workdir "$w"
w=$(copy no_csv); rm "$w/results.csv"
case_ 48.6c_results_csv_missing "$w" 300 python run.py $SMOKE --workdir "$w"
w=$(fresh tb_file); mkdir -p "$w"; echo x > "$w/tensorboard"
case_ 48.6d_tensorboard_is_a_file "$w" 300 python run.py --config configs/cifar100.py:smoke --workdir "$w"
echo done
