#!/usr/bin/env bash
# Call 4: the gathered gradients' GPU tests as corrected after call 3 (float32 runs within
# rounding, bf16 as one step's gradients).
set -u
. benchmarks/stages.sh call4 120
stage gpu_tests 100 python3 -m pytest -q -p no:cacheprovider tests/test_gathered_gpu.py \
    tests/test_sgd_update_gpu.py
