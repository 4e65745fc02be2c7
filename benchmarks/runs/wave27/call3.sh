#!/usr/bin/env bash
# Call 3: the GPU tests whose run helper (tests/test_fusion._run) changed after wave 26's
# calls, in what device time was left.
set -u
. benchmarks/stages.sh call3 100
stage gpu_tests_helper 80 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_add_relu.py \
    tests/test_conv_relu_gpu.py
