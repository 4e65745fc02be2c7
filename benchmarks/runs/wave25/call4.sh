#!/usr/bin/env bash
# Call 4: ResNet-50's rows of the combination matrix with the add taking its batch norm's
# sums (bn_sums, whose stage-one sums live from the add's call to the batch norm's): no
# budget, 50% of the unconstrained peak and the least budget, whole-batch and split
# statistics, bf16 and fp32; each cell's peak and step beside its plan.
set -u
. benchmarks/stages.sh call4 300
stage matrix_resnet50_bf16 140 python3 scripts/matrix_gpu.py --out $OUT/matrix_resnet50_bf16 \
    --in-process --models resnet50 --precisions bf16 --fractions 0.5,least --time-limit 125
stage matrix_resnet50_fp32 140 python3 scripts/matrix_gpu.py --out $OUT/matrix_resnet50_fp32 \
    --in-process --models resnet50 --precisions fp32 --fractions 0.5,least --time-limit 125
