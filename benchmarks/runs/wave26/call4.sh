#!/usr/bin/env bash
# Call 4: VGG-16 TF32 in 4 GiB beside PyTorch's accumulation of 8 x 32 (channels_last, eager
# and compiled), each framework's unconstrained step beside it.
set -u
. benchmarks/stages.sh call4 300
stage budget_vgg16_tf32 280 python3 scripts/bench_budget.py --model vgg16 --batch 256 \
    --math tf32 --caps none,4GiB --accumulate 8 --layouts channels_last --segments "" \
    --no-whole-batch --timeout 100 --time-limit 270 --out $OUT/budget_vgg16_tf32
