#!/usr/bin/env bash
# Call 4: ResNet-50 bf16 with whole-batch statistics in 8 GiB beside PyTorch's gradient
# accumulation 2 under the same cap (channels_last + bf16 autocast, eager and compiled), and
# minidnn's unconstrained step.
set -u
. benchmarks/stages.sh call4 170
stage r50_bf16_none 35 python3 scripts/bench_budget.py --model resnet50 --batch 256 \
    --math bf16 --caps none --only minidnn --steps 6 --warmup 4 --timeout 30 --time-limit 30 \
    --out $OUT/r50_bf16_none
stage r50_bf16_8gib 125 python3 scripts/bench_budget.py --model resnet50 --batch 256 \
    --math bf16 --caps 8GiB --accumulate 2 --segments "" --layouts channels_last \
    --no-whole-batch --steps 5 --warmup 4 --timeout 90 --time-limit 118 \
    --out $OUT/r50_bf16_8gib
