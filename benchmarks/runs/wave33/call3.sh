#!/usr/bin/env bash
# Call 3: VGG-16 under 12 GiB beside PyTorch's accumulation and whole-batch step, eager and
# compiled, in TF32 and bf16 (profiles timed back to back again); GoogLeNet fp32's cells at
# 35 and 25% if time is left.
set -u
. benchmarks/stages.sh call3 440
stage budget_vgg16_tf32 150 python3 scripts/bench_budget.py --model vgg16 --batch 256 \
    --math tf32 --caps 12GiB --accumulate 2 --layouts channels_last --segments "" \
    --no-whole-batch --timeout 90 --time-limit 145 --out $OUT/budget_vgg16_tf32
stage budget_vgg16_bf16 170 python3 scripts/bench_budget.py --model vgg16 --batch 256 \
    --math bf16 --caps 12GiB --accumulate 2 --layouts channels_last --segments "" \
    --timeout 80 --time-limit 165 --out $OUT/budget_vgg16_bf16
stage matrix_googlenet 120 python3 scripts/matrix_gpu.py --out $OUT/matrix_googlenet \
    --in-process --models googlenet --precisions fp32 --fractions 0.35,0.25 --time-limit 115
