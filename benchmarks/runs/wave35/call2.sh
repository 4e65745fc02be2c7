#!/usr/bin/env bash
# Call 2: ResNet-50 bf16 under 4 GiB and VGG-16 bf16 under 6 GiB beside PyTorch's
# accumulation, eager and compiled (caps not yet measured in bf16).
set -u
. benchmarks/stages.sh call2 540
stage budget_resnet50_bf16 260 python3 scripts/bench_budget.py --model resnet50 --batch 256 \
    --math bf16 --caps 4GiB --accumulate 4,8 --layouts channels_last --segments "" \
    --no-whole-batch --split-batch-statistics --timeout 70 --time-limit 255 \
    --out $OUT/budget_resnet50_bf16
stage budget_vgg16_bf16 250 python3 scripts/bench_budget.py --model vgg16 --batch 256 \
    --math bf16 --caps 6GiB --accumulate 2,4 --layouts channels_last --segments "" \
    --no-whole-batch --timeout 70 --time-limit 245 --out $OUT/budget_vgg16_bf16
