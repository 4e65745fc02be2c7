#!/usr/bin/env bash
# Call 1: AlexNet's pass of 4 images timed in sequence beside its calls alone (where the step
# model's 2 us a call at 4 images goes); ResNet-50 TF32 under 4 GiB and VGG-16 TF32 under
# 6 GiB beside PyTorch's accumulation, eager and compiled (caps not yet measured).
set -u
. benchmarks/stages.sh call1 570
for p in fp32 bf16; do
    stage sequence_alexnet_$p 60 python3 benchmarks/runs/wave35/sequence_clock.py \
        --model alexnet --batch 4 --precision $p --pairs
done
stage budget_resnet50_tf32 220 python3 scripts/bench_budget.py --model resnet50 --batch 256 \
    --math tf32 --caps 4GiB --accumulate 8 --layouts channels_last --segments "" \
    --no-whole-batch --split-batch-statistics --timeout 90 --time-limit 215 \
    --out $OUT/budget_resnet50_tf32
stage budget_vgg16_tf32 200 python3 scripts/bench_budget.py --model vgg16 --batch 256 \
    --math tf32 --caps 6GiB --accumulate 4 --layouts channels_last --segments "" \
    --no-whole-batch --timeout 80 --time-limit 195 --out $OUT/budget_vgg16_tf32
