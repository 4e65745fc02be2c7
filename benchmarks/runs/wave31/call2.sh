#!/usr/bin/env bash
# Call 2: an event's crossing between engines in the profile and the timeline
# (Profile.sync_latency_s) beside each copy's latency: its GPU tests, and the matrix's cells
# of 64 passes of 4 again with it (AlexNet and GoogLeNet bf16, GoogLeNet fp32, ResNet-50 bf16
# with split statistics at their least budget).
set -u
. benchmarks/stages.sh call2 575
stage gpu_tests 40 python3 -m pytest -q -s -p no:cacheprovider tests/test_profile_gpu.py
stage matrix_alexnet 70 python3 scripts/matrix_gpu.py --out $OUT/matrix_alexnet --in-process \
    --models alexnet --precisions bf16 --fractions least --time-limit 65
stage matrix_googlenet 130 python3 scripts/matrix_gpu.py --out $OUT/matrix_googlenet \
    --in-process --models googlenet --precisions bf16 --fractions least --time-limit 120
stage matrix_googlenet_fp32 140 python3 scripts/matrix_gpu.py --out $OUT/matrix_googlenet_fp32 \
    --in-process --models googlenet --precisions fp32 --fractions least --time-limit 130
stage matrix_resnet50 180 python3 scripts/matrix_gpu.py --out $OUT/matrix_resnet50 \
    --in-process --models resnet50 --precisions bf16 --statistics split --fractions least \
    --time-limit 170
