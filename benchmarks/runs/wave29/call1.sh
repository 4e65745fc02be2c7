#!/usr/bin/env bash
# Call 1: the combination matrix's rows of AlexNet, OverFeat, GoogLeNet and VGG-16 with the
# planner that weighs ReLU bit masks (50% of the unconstrained peak and the least budget, fp32
# and bf16); ResNet-50 TF32 with whole-batch statistics in 8 GiB beside its unconstrained step.
set -u
. benchmarks/stages.sh call1 570
stage resnet50_tf32_8gib 170 python3 scripts/bench_budget.py --model resnet50 --batch 256 \
    --math tf32 --caps none,8GiB --only minidnn --layouts channels_last --segments "" \
    --no-whole-batch --timeout 80 --time-limit 160 --out $OUT/resnet50_tf32_8gib
stage matrix 370 python3 scripts/matrix_gpu.py --out $OUT/matrix --in-process \
    --models alexnet,overfeat,googlenet,vgg16 --precisions bf16,fp32 --fractions 0.5,least \
    --time-limit 355
