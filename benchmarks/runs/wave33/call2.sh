#!/usr/bin/env bash
# Call 2: AlexNet's matrix cells predicted from both clocks beside one measured step each;
# VGG-16 under 12 GiB beside PyTorch's accumulation, eager and compiled, in TF32 and bf16.
set -u
. benchmarks/stages.sh call2 590
stage cache_clock_alexnet 200 python3 benchmarks/runs/wave33/cache_clock.py \
    $OUT/cache_alexnet -- --models alexnet --precisions fp32,bf16 --fractions 0.25,least \
    --time-limit 170
stage budget_vgg16_tf32 180 python3 scripts/bench_budget.py --model vgg16 --batch 256 \
    --math tf32 --caps 12GiB --accumulate 2,4 --layouts channels_last --segments "" \
    --no-whole-batch --timeout 90 --time-limit 175 --out $OUT/budget_vgg16_tf32
stage budget_vgg16_bf16 190 python3 scripts/bench_budget.py --model vgg16 --batch 256 \
    --math bf16 --caps 12GiB --accumulate 2 --layouts channels_last --segments "" \
    --timeout 80 --time-limit 185 --out $OUT/budget_vgg16_bf16
