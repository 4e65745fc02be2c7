#!/usr/bin/env bash
# Call 1: the fully connected products that add their weight gradients (GPU tests, with the
# tests whose run helper changed after the last wave's calls); where VGG-16's steps spend
# their kernels: bf16 with and without ReLU bit masks beside PyTorch's compiled step, TF32 in
# 4 GiB and unconstrained, one replayed step each.
set -u
. benchmarks/stages.sh call1 570
stage gpu_tests 110 python3 -m pytest -q -p no:cacheprovider -x tests/test_linear_add_gpu.py \
    tests/test_micro_batches_gpu.py tests/test_conv_relu_gpu.py tests/test_gpu_add_relu.py \
    tests/test_pool_relu_gpu.py tests/test_profile_gpu.py tests/test_deterministic_gpu.py
stage bench_vgg16_bf16 150 python3 scripts/bench_vs_pytorch.py --runs vgg16:256:bf16 \
    --frameworks minidnn minidnn-relubits pytorch-cl-bf16-compiled --steps 10 --warmup 3 \
    --timeout 120
stage kernels_vgg16_bf16 45 python3 scripts/step_kernels.py --model vgg16 --precision bf16 \
    --no-relu-bits --top 40
stage kernels_vgg16_bf16_bits 45 python3 scripts/step_kernels.py --model vgg16 \
    --precision bf16 --top 40
stage kernels_vgg16_tf32_4gib 110 python3 scripts/step_kernels.py --model vgg16 \
    --memory-budget 4GiB --top 40
stage kernels_vgg16_tf32 45 python3 scripts/step_kernels.py --model vgg16 --top 40
