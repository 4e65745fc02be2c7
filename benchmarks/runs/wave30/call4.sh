#!/usr/bin/env bash
# Call 4: ResNet-50 bf16 with whole-batch statistics in 8 and 6 GiB, planned by greedy from
# the closest segments, beside PyTorch's gradient accumulation under the same caps
# (channels_last + bf16 autocast, eager and compiled) and minidnn's unconstrained step.
set -u
. benchmarks/stages.sh call4 250
stage r50_bf16_none 40 python3 scripts/bench_budget.py --model resnet50 --batch 256 \
    --math bf16 --caps none --only minidnn --steps 6 --warmup 4 --timeout 35 --time-limit 35 \
    --out $OUT/r50_bf16_none
stage r50_bf16_caps 200 python3 scripts/bench_budget.py --model resnet50 --batch 256 \
    --math bf16 --caps 8GiB,6GiB --accumulate 2 --segments "" --layouts channels_last \
    --no-whole-batch --steps 5 --warmup 4 --timeout 100 --time-limit 190 \
    --out $OUT/r50_bf16_caps
