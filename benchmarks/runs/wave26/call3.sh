#!/usr/bin/env bash
# Call 3: the column passes' rows strided over the map (cuda_pointwise.STRIDED_COLUMNS), so
# that the blocks running at once touch neighbouring memory, in the fused pool and in every
# column pass (the ReLU's backward with its bias sums, bias_grad): the GPU tests of both
# orders and the fused pool, the clock in both orders, and VGG-16 in TF32 and bf16 beside
# PyTorch's compiled step.
set -u
. benchmarks/stages.sh call3 400
stage gpu_tests 90 python3 -m pytest -q -p no:cacheprovider tests/test_pool_relu_gpu.py \
    tests/test_pointwise_gpu.py -k "sum or bias or relu or orders"
stage pool_sums_clock 60 python3 benchmarks/runs/wave26/pool_sums_clock.py
stage bench_vgg16_tf32 100 python3 scripts/bench_vs_pytorch.py --runs vgg16:256:tf32 \
    --frameworks minidnn pytorch-cl-compiled --steps 10 --warmup 3 --timeout 90 \
    --out $OUT/bench_vgg16_tf32.json
stage bench_vgg16_bf16 80 python3 scripts/bench_vs_pytorch.py --runs vgg16:256:bf16 \
    --frameworks minidnn pytorch-cl-bf16-compiled --steps 10 --warmup 3 --timeout 70 \
    --out $OUT/bench_vgg16_bf16.json
