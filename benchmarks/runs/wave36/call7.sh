#!/usr/bin/env bash
# Call 7: at 9179af4 (the greedy's estimate of a recomputation without the bias's pass), the
# cells whose plans recompute or split most of those of call 4: VGG-16 fp32 at 25% and AlexNet
# bf16 at its least budget (the largest miss of call 4).
set -u
. benchmarks/stages.sh call7 150
stage matrix_vgg16_fp32 75 python3 scripts/matrix_gpu.py --out $OUT/matrix_vgg16_fp32 \
    --in-process --models vgg16 --precisions fp32 --fractions 0.25 --time-limit 70
stage matrix_alexnet_bf16 60 python3 scripts/matrix_gpu.py --out $OUT/matrix_alexnet_bf16 \
    --in-process --models alexnet --precisions bf16 --fractions least --time-limit 55
