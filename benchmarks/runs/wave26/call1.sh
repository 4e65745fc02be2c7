#!/usr/bin/env bash
# Call 1: a max pool's backward that sums the bias gradient of the convolution before its
# ReLU (pool_bias): its GPU tests (the kernel against the pool then bias_grad, bit for bit,
# every geometry, layout and dtype; steps with and without it), the two ways timed on
# VGG-16's pool inputs, VGG-16 in TF32 and bf16 and OverFeat in TF32 beside PyTorch's eager
# and compiled steps (channels_last; bf16 autocast for bf16).
set -u
. benchmarks/stages.sh call1 580
stage gpu_tests 110 python3 -m pytest -q -p no:cacheprovider tests/test_pool_relu_gpu.py \
    tests/test_pointwise_gpu.py -k "sum or bias or relu"
stage pool_sums_clock 45 python3 benchmarks/runs/wave26/pool_sums_clock.py
stage bench_vgg16_tf32 130 python3 scripts/bench_vs_pytorch.py --runs vgg16:256:tf32 \
    --frameworks minidnn pytorch-cl pytorch-cl-compiled --steps 10 --warmup 3 --profile \
    --timeout 110 --out $OUT/bench_vgg16_tf32.json
stage bench_vgg16_bf16 120 python3 scripts/bench_vs_pytorch.py --runs vgg16:256:bf16 \
    --frameworks minidnn pytorch-cl-bf16 pytorch-cl-bf16-compiled --steps 10 --warmup 3 \
    --timeout 100 --out $OUT/bench_vgg16_bf16.json
stage bench_overfeat_tf32 90 python3 scripts/bench_vs_pytorch.py --runs overfeat:256:tf32 \
    --frameworks minidnn pytorch-cl pytorch-cl-compiled --steps 10 --warmup 3 --timeout 75 \
    --out $OUT/bench_overfeat_tf32.json
