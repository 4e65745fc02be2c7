#!/usr/bin/env bash
# Call 5: more of the matrix's cells whose convolutions have a bias, with the bias's pass left
# out where the ReLU adds it: those nearest the low end of the step target before (VGG-16 fp32
# at its least budget, 0.953; OverFeat fp32 at its least, 0.989) and passes of other sizes.
set -u
. benchmarks/stages.sh call5 420
stage matrix_overfeat 90 python3 scripts/matrix_gpu.py --out $OUT/matrix_overfeat \
    --in-process --models overfeat --precisions fp32,bf16 --fractions least --time-limit 85
stage matrix_vgg16_fp32 130 python3 scripts/matrix_gpu.py --out $OUT/matrix_vgg16_fp32 \
    --in-process --models vgg16 --precisions fp32 --fractions least,0.5 --time-limit 125
stage matrix_alexnet 80 python3 scripts/matrix_gpu.py --out $OUT/matrix_alexnet \
    --in-process --models alexnet --precisions fp32,bf16 --fractions 0.5 --time-limit 75
stage matrix_googlenet_fp32 100 python3 scripts/matrix_gpu.py --out $OUT/matrix_googlenet_fp32 \
    --in-process --models googlenet --precisions fp32 --fractions 0.5 --time-limit 95
