#!/usr/bin/env bash
# Call 4: the call gap in the step model on ResNet-50's cells: split statistics at the least
# budget (64 passes of 4, the cell furthest from its prediction in wave 34) and one pass at
# 50% of the peak in both precisions (calls of 256 images, where the gap is a small part).
set -u
. benchmarks/stages.sh call4 480
stage matrix_resnet50_split_fp32 200 python3 scripts/matrix_gpu.py \
    --out $OUT/matrix_resnet50_split_fp32 --in-process --models resnet50 --precisions fp32 \
    --statistics split --fractions least --time-limit 195
stage matrix_resnet50 250 python3 scripts/matrix_gpu.py --out $OUT/matrix_resnet50 \
    --in-process --models resnet50 --precisions bf16,fp32 --statistics whole --fractions 0.5 \
    --time-limit 245
