#!/usr/bin/env bash
# Call 3: the matrix's other cells with the copy and sync latencies in the step model:
# OverFeat and VGG-16 bf16 at their least budget (64 passes of 4, predicted 16% and 5% slow
# in wave 30), ResNet-50 fp32 at 50% of its peak (1.100 in wave 30).
set -u
. benchmarks/stages.sh call3 575
stage matrix_overfeat 110 python3 scripts/matrix_gpu.py --out $OUT/matrix_overfeat \
    --in-process --models overfeat --precisions bf16 --fractions least --time-limit 100
stage matrix_vgg16 170 python3 scripts/matrix_gpu.py --out $OUT/matrix_vgg16 \
    --in-process --models vgg16 --precisions bf16 --fractions least --time-limit 160
stage matrix_resnet50 180 python3 scripts/matrix_gpu.py --out $OUT/matrix_resnet50 \
    --in-process --models resnet50 --precisions fp32 --statistics whole --fractions 0.5 \
    --time-limit 170
