#!/bin/bash
# Runs the three seeds one after another with 2 threads (seed 0's first run); stdout/stderr + wall time per run under logs/.
for s in 0 1 2; do TORCH_THREADS=2 "$(dirname "$0")/run_seeds_parallel.sh" $s; done
