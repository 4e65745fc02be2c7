#!/usr/bin/env bash
# Call 2: the fused pool's tiles path issuing the loads of several pixels before using the
# first (cuda_pool.SUMS_BATCH): its GPU tests, the clock at each setting, VGG-16 in TF32 and
# bf16 beside PyTorch's compiled step, and VGG-16's rows of the combination matrix (fp32 and
# bf16, 50% and the least budget), whose pools now take the bias sums in their call.
set -u
. benchmarks/stages.sh call2 585
stage gpu_tests 70 python3 -m pytest -q -p no:cacheprovider tests/test_pool_relu_gpu.py \
    -k "summing or tiles_loads or sum_bias"
stage pool_sums_clock 50 python3 benchmarks/runs/wave26/pool_sums_clock.py
stage bench_vgg16_tf32 100 python3 scripts/bench_vs_pytorch.py --runs vgg16:256:tf32 \
    --frameworks minidnn pytorch-cl-compiled --steps 10 --warmup 3 --timeout 90 \
    --out $OUT/bench_vgg16_tf32.json
stage bench_vgg16_bf16 80 python3 scripts/bench_vs_pytorch.py --runs vgg16:256:bf16 \
    --frameworks minidnn pytorch-cl-bf16-compiled --steps 10 --warmup 3 --timeout 70 \
    --out $OUT/bench_vgg16_bf16.json
stage matrix_vgg16 250 python3 scripts/matrix_gpu.py --out $OUT/matrix --in-process \
    --models vgg16 --precisions fp32,bf16 --fractions 0.5,least --time-limit 235
