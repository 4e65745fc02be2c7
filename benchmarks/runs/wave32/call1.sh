#!/usr/bin/env bash
# Call 1: the first convolutions' narrow inputs (3 channels) against inputs padded to 4 and
# 8; the profile's copy measurements through one helper (their GPU tests); the combination
# matrix's cells of AlexNet, OverFeat and VGG-16 with the step model of the thirty-first wave.
set -u
. benchmarks/stages.sh call1 590
stage narrow_input 70 python3 benchmarks/runs/wave32/narrow_input.py
stage gpu_tests 40 python3 -m pytest -q -s -p no:cacheprovider tests/test_profile_gpu.py
stage matrix_alexnet 140 python3 scripts/matrix_gpu.py --out $OUT/matrix_alexnet --in-process \
    --models alexnet --precisions fp32,bf16 --fractions 0.75,0.5,0.35,0.25,least \
    --time-limit 135
stage matrix_overfeat 110 python3 scripts/matrix_gpu.py --out $OUT/matrix_overfeat \
    --in-process --models overfeat --precisions fp32,bf16 \
    --fractions 0.75,0.5,0.35,0.25,least --time-limit 105
stage matrix_vgg16 200 python3 scripts/matrix_gpu.py --out $OUT/matrix_vgg16 --in-process \
    --models vgg16 --precisions fp32,bf16 --fractions 0.75,0.5,0.35,0.25,least \
    --time-limit 195
