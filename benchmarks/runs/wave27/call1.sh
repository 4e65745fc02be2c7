#!/usr/bin/env bash
# Call 1: where VGG-16's steps spend their kernels: bf16 with and without ReLU bit masks
# beside PyTorch's compiled step; TF32 unconstrained and in 4 GiB, one replayed step each.
set -u
. benchmarks/stages.sh call1 560
stage bench_vgg16_bf16 200 python3 scripts/bench_vs_pytorch.py --runs vgg16:256:bf16 \
    --frameworks minidnn minidnn-relubits pytorch-cl-bf16-compiled --steps 10 --warmup 3 \
    --profile --timeout 150
stage kernels_vgg16_bf16 60 python3 scripts/step_kernels.py --model vgg16 --precision bf16 \
    --no-relu-bits --top 40
stage kernels_vgg16_bf16_bits 60 python3 scripts/step_kernels.py --model vgg16 \
    --precision bf16 --top 40
stage kernels_vgg16_tf32 60 python3 scripts/step_kernels.py --model vgg16 --top 40
stage kernels_vgg16_tf32_4gib 150 python3 scripts/step_kernels.py --model vgg16 \
    --memory-budget 4GiB --top 40
