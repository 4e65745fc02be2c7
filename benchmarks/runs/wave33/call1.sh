#!/usr/bin/env bash
# Call 1: the profile's clock from the L2 cache a step leaves (its GPU test; the matrix's
# AlexNet and VGG-16 cells predicted from both clocks); the fused pool's bf16 rows; ResNet-50
# bf16 beside PyTorch's compiled step.
set -u
. benchmarks/stages.sh call1 590
stage gpu_tests 45 python3 -m pytest -q -p no:cacheprovider tests/test_profile_gpu.py
stage pool_clock_bf16 70 python3 benchmarks/runs/wave32/pool_run_clock.py --dtypes bf16
stage cache_clock_alexnet 170 python3 benchmarks/runs/wave33/cache_clock.py \
    $OUT/cache_alexnet -- --models alexnet --precisions fp32,bf16 --fractions 0.25,least \
    --time-limit 80
stage cache_clock_vgg16 150 python3 benchmarks/runs/wave33/cache_clock.py $OUT/cache_vgg16 \
    -- --models vgg16 --precisions fp32 --fractions 0.5 --time-limit 70
stage bench_resnet50_bf16 150 python3 scripts/bench_vs_pytorch.py --runs resnet50:256:bf16 \
    --frameworks minidnn pytorch-cl-bf16 pytorch-cl-bf16-compiled --steps 10 --warmup 3 \
    --timeout 140 --out $OUT/bench_resnet50_bf16.json
