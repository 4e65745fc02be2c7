#!/usr/bin/env bash
# Call 1: the profile's bf16 products timed reading a shared weight copy, the copies priced
# once a step (Profile.weight_copy_s): its GPU test, and the combination matrix's bf16 rows of
# AlexNet, OverFeat and VGG-16 (their 64-pass cells were predicted 14-72% slow); ResNet-50
# TF32 with whole-batch statistics in 8 and 6 GiB, planned by greedy from the closest
# segments, beside its unconstrained step; GoogLeNet's rows with this code.
set -u
. benchmarks/stages.sh call1 570
stage gpu_tests 60 python3 -m pytest -q -p no:cacheprovider tests/test_profile_gpu.py
stage resnet50_tf32 130 python3 scripts/bench_budget.py --model resnet50 --batch 256 \
    --math tf32 --caps none,8GiB,6GiB --only minidnn --layouts channels_last --segments "" \
    --no-whole-batch --timeout 80 --time-limit 120 --out $OUT/resnet50_tf32
stage matrix_bf16 200 python3 scripts/matrix_gpu.py --out $OUT/matrix_bf16 --in-process \
    --models alexnet,overfeat,vgg16 --precisions bf16 --fractions 0.5,least --time-limit 190
stage matrix_googlenet 150 python3 scripts/matrix_gpu.py --out $OUT/matrix_googlenet \
    --in-process --models googlenet --precisions bf16,fp32 --fractions 0.5,least \
    --time-limit 140
