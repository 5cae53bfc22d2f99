#!/usr/bin/env bash
# Issue 83's times on a folder of Tiny-ImageNet's shape (make_tiny.py), by docs/data.md's recipe at
# configs/folder.py:cpu, a sweep of 2 seeds per method, one after the other on the same machine: for each
# method the dry run's estimate, then the run itself; then --mode bench (one run, M = 2). The load average
# is recorded around each step.
#   python experiments/results/cpu_folder_times/make_tiny.py TINY
#   experiments/results/cpu_folder_times/run.sh TINY OUT
set -u
T=$1; out=$2; mkdir -p "$out/lists"
head -n 100 "$T/wnids.txt" > "$out/lists/classes.txt"
awk -F'\t' 'BEGIN {print "path,label"} {print $1","$2}' "$T/val/val_annotations.txt" > "$out/lists/val.csv"
F=(--config.data.folder.train="$T/train" --config.data.folder.class_depth=1
   --config.data.folder.classes="$out/lists/classes.txt" --config.data.folder.test="$out/lists/val.csv"
   --config.data.folder.root="$T/val/images" --config.data.folder.num_base=60 --config.data.folder.way=5
   --config.data.folder.num_sessions=9)
export F2M_CACHE_DIR=$out/cache
load() { echo "$1 $(date +%T) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/load.txt"; }
for method in f2m baseline; do
  load "$method dry run"
  /usr/bin/time -f "$method dry run %e s" python run.py --config configs/folder.py:cpu --dry-run "${F[@]}" \
      --config.members.seeds='(0,1)' --config.method=$method > "$out/${method}_dry_run.txt" 2> "$out/${method}_dry_run.err"
  load "$method run"
  /usr/bin/time -f "$method run %e s" python run.py --config configs/folder.py:cpu --workdir "$out/$method" "${F[@]}" \
      --config.members.seeds='(0,1)' --config.method=$method > "$out/$method.log" 2>&1
done
load bench
python run.py --config configs/folder.py:cpu --mode bench --workdir "$out/bench" "${F[@]}" \
    --config.bench.M_list='(2,)' --config.bench.iters=10 > "$out/bench.log" 2> "$out/bench.err"
load end
