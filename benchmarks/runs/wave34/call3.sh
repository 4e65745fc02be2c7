#!/usr/bin/env bash
# Call 3: ResNet-50 TF32 under 12 GiB beside PyTorch's accumulation, eager and compiled
# (PyTorch's whole-batch step needs 20.5 GiB); VGG-16 TF32 under 12 GiB beside the PyTorch
# configurations the thirty-third wave did not run (compiled accumulation 4, checkpointing).
set -u
. benchmarks/stages.sh call3 555
stage budget_resnet50_tf32 270 python3 scripts/bench_budget.py --model resnet50 --batch 256 \
    --math tf32 --caps 12GiB --accumulate 2 --layouts channels_last --segments "" \
    --no-whole-batch --split-batch-statistics --timeout 100 --time-limit 265 \
    --out $OUT/budget_resnet50_tf32
stage budget_vgg16_tf32 260 python3 scripts/bench_budget.py --model vgg16 --batch 256 \
    --math tf32 --caps 12GiB --accumulate 4 --layouts channels_last --segments 2 \
    --no-whole-batch --timeout 80 --time-limit 255 --out $OUT/budget_vgg16_tf32
