#!/usr/bin/env bash
# usage: experiments/results/cpu_memory/measure.sh NAME [NAME...] (from the root of the code measured)
# Runs each named config as a whole run.py command under /usr/bin/time -v, the compilation cache off (so
# that compiling counts), and keeps NAME.time (time's report: "Maximum resident set size") and NAME.log
# beside this script (or in $OUT). memory_check=False (or $CHECK): the check (the code measured may refuse
# or warn) stays out; with CHECK=True it runs as in a user's run (it compiles the run's programs first).
set -u
OUT=${OUT:-$(dirname "$0")}; CHECK=${CHECK:-False}; W=${W:-/tmp/e-mem}; mkdir -p "$OUT"
: "${F2M_DATA_DIR:?set F2M_DATA_DIR to the folder with the CIFAR-100 archive (docs/data.md)}"; export F2M_DATA_DIR
SMOKE="--config configs/cifar100.py:smoke --config.runs=1"
for n in "$@"; do
  case $n in
    runtime) a="--config configs/cifar100.py:smoke --dry-run";;
    smoke) a="--config configs/cifar100.py:smoke";;
    cpu) a="--config configs/cifar100.py:cpu --config.data.source=trainsplit --config.base.steps=20 --config.runs=1";;
    trainsplit) a="--config configs/cifar100.py:trainsplit --config.base.steps=2 --config.runs=1 --config.incremental.steps=1";;
    minismoke) a="--config configs/mini.py:smoke --config.base.steps=4 --config.runs=1";;
    mini32_w0) a="--config configs/mini.py:smoke --config.model.width=0 --config.base.steps=4 --config.runs=1";;
    trainsplit_e5000) a="--config configs/cifar100.py:trainsplit --config.base.steps=2 --config.runs=1 --config.incremental.steps=1 --config.eval.batch_size=5000";;
    pooltest*) a="$SMOKE --config.base.steps=10 --config.data.synthetic.num_sessions=3 --config.data.synthetic.test_per_class=${n#pooltest}";;
    mini84) a="--config configs/mini.py:smoke --config.model.width=0 --config.data.image_size=84 --config.base.steps=4 --config.runs=1";;
    cub224) a="--config configs/cub200.py:smoke --config.model.width=0 --config.data.image_size=224 --config.base.steps=2 --config.runs=1";;
    eval*) a="$SMOKE --config.base.steps=10 --config.eval.batch_size=${n#eval}";;
    pool[0-9]*) a="$SMOKE --config.base.steps=10 --config.data.synthetic.train_per_class=${n#pool}";;
    *) echo "unknown run $n"; exit 2;;
  esac
  rm -rf "${W:?}/$n"; mkdir -p "$W"
  echo "$n: python run.py $a --config.compilation_cache=False --config.memory_check=$CHECK" > "$OUT/$n.time"
  nice /usr/bin/time -v -a -o "$OUT/$n.time" python run.py $a --config.compilation_cache=False \
    --config.memory_check=$CHECK --workdir "$W/$n" > "$OUT/$n.log" 2>&1 &
  timer=$!; t0=$(date +%s); : > "$OUT/$n.rss"
  while kill -0 $timer 2> /dev/null; do  # the run's resident memory every 2 s: seconds, MiB
    pid=$(pgrep -P $timer | head -1)
    [ -n "$pid" ] && echo "$(( $(date +%s) - t0 )) $(awk '/VmRSS/ {print int($2 / 1024)}' /proc/$pid/status 2> /dev/null)" >> "$OUT/$n.rss"
    sleep 2
  done
  wait $timer
  echo "$n rc=$? $(grep -h 'Maximum resident' "$OUT/$n.time")"
done
