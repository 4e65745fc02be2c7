#!/usr/bin/env bash
# Call 2: ResNet-50's rows of the combination matrix with this wave's code (whole-batch and
# split statistics, bf16 and fp32, 50% of the unconstrained peak and the least budget); bf16
# with whole-batch statistics in 8 and 6 GiB beside its unconstrained step.
set -u
. benchmarks/stages.sh call2 570
stage resnet50_bf16 120 python3 scripts/bench_budget.py --model resnet50 --batch 256 \
    --math bf16 --caps none,8GiB,6GiB --only minidnn --layouts channels_last --segments "" \
    --no-whole-batch --timeout 80 --time-limit 110 --out $OUT/resnet50_bf16
stage matrix_resnet50_bf16 200 python3 scripts/matrix_gpu.py --out $OUT/matrix_resnet50_bf16 \
    --in-process --models resnet50 --precisions bf16 --fractions 0.5,least --time-limit 190
stage matrix_resnet50_fp32 200 python3 scripts/matrix_gpu.py --out $OUT/matrix_resnet50_fp32 \
    --in-process --models resnet50 --precisions fp32 --fractions 0.5,least --time-limit 190
