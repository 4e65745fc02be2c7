#!/usr/bin/env bash
# Call 3: VGG-16 TF32 in 4 GiB forced into 4 passes (with conv1_1..pool1 in 2 pieces, and
# without), beside dyn's choice and the unconstrained step; ResNet-50 in 6 GiB, TF32 and bf16,
# whole-batch and split statistics, beside PyTorch's accumulation (eager and compiled).
set -u
. benchmarks/stages.sh call3 570
stage vgg16_tf32_forced 190 python3 scripts/bench_budget.py --model vgg16 --batch 256 \
    --math tf32 --caps none,4GiB --only minidnn --minidnn-split "4/conv1_1:pool1:2;4" \
    --timeout 80 --time-limit 180 --out $OUT/vgg16_tf32_forced
stage r50_tf32_6gib 190 python3 scripts/bench_budget.py --model resnet50 --batch 256 \
    --math tf32 --caps 6GiB --accumulate 4 --split-batch-statistics --layouts channels_last \
    --segments "" --no-whole-batch --timeout 100 --time-limit 185 --out $OUT/r50_tf32_6gib
stage r50_bf16_6gib 170 python3 scripts/bench_budget.py --model resnet50 --batch 256 \
    --math bf16 --caps 6GiB --accumulate 2 --split-batch-statistics --layouts channels_last \
    --segments "" --no-whole-batch --timeout 90 --time-limit 165 --out $OUT/r50_bf16_6gib
