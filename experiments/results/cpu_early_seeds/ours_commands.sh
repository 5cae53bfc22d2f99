#!/bin/bash
# Issue 28 item 5: our base session's early curve, 3 seeds, clean-weight backward (as the authors' code on a current PyTorch).
# One seed at a time, by early_one.sh (seed 0 ran from an earlier copy of this loop with early_one.sh's body inline).
for seed in 0 1 2; do bash "$(dirname "$0")/early_one.sh" $seed; done
