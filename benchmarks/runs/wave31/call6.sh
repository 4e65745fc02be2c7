#!/usr/bin/env bash
# Call 6: call 5's change on ResNet-50 fp32's other cells: split statistics at 50% (1.049 in
# wave 30) and whole-batch statistics at its least budget (0.944).
set -u
. benchmarks/stages.sh call6 300
stage matrix_fp32_split 140 python3 scripts/matrix_gpu.py --out $OUT/matrix_fp32_split \
    --in-process --models resnet50 --precisions fp32 --statistics split --fractions 0.5 \
    --time-limit 135
stage matrix_fp32_least 140 python3 scripts/matrix_gpu.py --out $OUT/matrix_fp32_least \
    --in-process --models resnet50 --precisions fp32 --statistics whole --fractions least \
    --time-limit 135
