#!/usr/bin/env bash
# Call 1: where VGG-16's steps spend their kernels: bf16 with and without ReLU bit masks
# beside PyTorch's compiled step; TF32 in 4 GiB and unconstrained, one replayed step each;
# ResNet-50 TF32 in 6 GiB (split statistics) beside PyTorch's accumulation of 4 x 64.
set -u
. benchmarks/stages.sh call1 570
stage bench_vgg16_bf16 150 python3 scripts/bench_vs_pytorch.py --runs vgg16:256:bf16 \
    --frameworks minidnn minidnn-relubits pytorch-cl-bf16-compiled --steps 10 --warmup 3 \
    --timeout 120
stage kernels_vgg16_bf16 45 python3 scripts/step_kernels.py --model vgg16 --precision bf16 \
    --no-relu-bits --top 40
stage kernels_vgg16_bf16_bits 45 python3 scripts/step_kernels.py --model vgg16 \
    --precision bf16 --top 40
stage budget_resnet50_tf32 200 python3 scripts/bench_budget.py --model resnet50 --batch 256 \
    --math tf32 --caps 6GiB --accumulate 4 --layouts channels_last --segments "" \
    --no-whole-batch --split-batch-statistics --timeout 100 --time-limit 190 \
    --out $OUT/budget_resnet50_tf32
stage kernels_vgg16_tf32_4gib 100 python3 scripts/step_kernels.py --model vgg16 \
    --memory-budget 4GiB --top 40
stage kernels_vgg16_tf32 45 python3 scripts/step_kernels.py --model vgg16 --top 40
