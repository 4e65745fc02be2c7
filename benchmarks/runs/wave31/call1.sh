#!/usr/bin/env bash
# Call 1: each copy's fixed latency (Profile.d2h_latency_s / h2d_latency_s): its GPU test and
# the times by size; the combination matrix's cells of 64 passes of 4 that wave 30's model
# predicted 12-30% fast (AlexNet, GoogLeNet and ResNet-50 bf16 at their least budget),
# planned and predicted with it; GoogLeNet fp32's rows, not run before.
set -u
. benchmarks/stages.sh call1 575
stage gpu_tests 60 python3 -m pytest -q -p no:cacheprovider tests/test_profile_gpu.py
stage copy_latency 30 python3 benchmarks/runs/wave31/copy_latency.py
stage matrix_alexnet 70 python3 scripts/matrix_gpu.py --out $OUT/matrix_alexnet --in-process \
    --models alexnet --precisions bf16 --fractions least --time-limit 65
stage matrix_googlenet 130 python3 scripts/matrix_gpu.py --out $OUT/matrix_googlenet \
    --in-process --models googlenet --precisions bf16 --fractions least --time-limit 120
stage matrix_resnet50 130 python3 scripts/matrix_gpu.py --out $OUT/matrix_resnet50 \
    --in-process --models resnet50 --precisions bf16 --fractions least --time-limit 120
stage matrix_googlenet_fp32 140 python3 scripts/matrix_gpu.py --out $OUT/matrix_googlenet_fp32 \
    --in-process --models googlenet --precisions fp32 --fractions 0.5,least --time-limit 130
