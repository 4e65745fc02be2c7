#!/usr/bin/env bash
# Call 2: the combination matrix's ResNet-50 cells not yet run with the final step model:
# bf16 with whole-batch statistics at 25%; split statistics, bf16 at 35 and 25% and fp32 at
# its least budget.
set -u
. benchmarks/stages.sh call2 555
stage matrix_resnet50_bf16 170 python3 scripts/matrix_gpu.py --out $OUT/matrix_resnet50 \
    --in-process --models resnet50 --precisions bf16 --statistics whole --fractions 0.25 \
    --time-limit 165
stage matrix_resnet50_split_bf16 190 python3 scripts/matrix_gpu.py \
    --out $OUT/matrix_resnet50_split_bf16 --in-process --models resnet50 --precisions bf16 \
    --statistics split --fractions 0.35,0.25 --time-limit 185
stage matrix_resnet50_split_fp32 180 python3 scripts/matrix_gpu.py \
    --out $OUT/matrix_resnet50_split_fp32 --in-process --models resnet50 --precisions fp32 \
    --statistics split --fractions least --time-limit 175
