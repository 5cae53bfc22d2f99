#!/bin/bash
# usage: run_one.sh REPO CONV_BACKWARD LOGFILE -- one cifar100 smoke run in a fresh workdir
W=$(mktemp -d -u /tmp/f2m61c_XXXXXX)
cd "$1" && F2M_DATA_DIR=/work/shared/data F2M_CACHE_DIR=/work/cache_issue61c_bench python run.py --config configs/cifar100.py:smoke --config.model.conv_backward=$2 --workdir $W >>"$3" 2>&1
rc=$?
rm -rf $W
exit $rc
