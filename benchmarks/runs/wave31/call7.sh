#!/usr/bin/env bash
# Call 7: a pass after the first adds every gradient but the gathered layers' (the step model
# had priced their adds too, 63 times in 64 passes): the cells of 64 passes of 4 with
# gathered layers, OverFeat (1.160 in call 3), VGG-16 and AlexNet bf16 at their least budget.
set -u
. benchmarks/stages.sh call7 200
stage matrix_overfeat 60 python3 scripts/matrix_gpu.py --out $OUT/matrix_overfeat \
    --in-process --models overfeat --precisions bf16 --fractions least --time-limit 55
stage matrix_vgg16 60 python3 scripts/matrix_gpu.py --out $OUT/matrix_vgg16 \
    --in-process --models vgg16 --precisions bf16 --fractions least --time-limit 55
stage matrix_alexnet 60 python3 scripts/matrix_gpu.py --out $OUT/matrix_alexnet \
    --in-process --models alexnet --precisions bf16 --fractions least --time-limit 55
