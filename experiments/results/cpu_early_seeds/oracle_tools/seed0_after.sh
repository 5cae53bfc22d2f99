#!/bin/bash
# Waits for the seed 1/2 runs to end, then reruns seed 0 to iteration 1002 with one thread
# (its first run, with 2 threads, stopped at iteration ~966); the old log is kept.
cd /work/oracle/authors
while pgrep -f "F2M_trainsplit_it1002_seed[12].yml" > /dev/null; do sleep 20; done
[ -f logs/seed0_stdout.log ] && mv logs/seed0_stdout.log logs/seed0_2threads_stdout.log
exec tools/run_seeds_parallel.sh 0
