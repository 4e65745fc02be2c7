#!/usr/bin/env bash
# Call 3: the fused pool's backward loading a run of pixels before adding them: its GPU
# tests, its clock at every run length, VGG-16 bf16's step beside PyTorch's compiled one;
# the combination matrix's bf16 row of GoogLeNet, which call 2 left.
set -u
. benchmarks/stages.sh call3 370
stage gpu_tests 50 python3 -m pytest -q -p no:cacheprovider tests/test_pool_relu_gpu.py
stage pool_run_clock 40 python3 benchmarks/runs/wave32/pool_run_clock.py
stage bench_vgg16_bf16 110 python3 scripts/bench_vs_pytorch.py --runs vgg16:256:bf16 \
    --frameworks minidnn pytorch-cl-bf16-compiled --steps 10 --warmup 3 --timeout 100 \
    --out $OUT/bench_vgg16_bf16.json
stage matrix_googlenet 140 python3 scripts/matrix_gpu.py --out $OUT/matrix_googlenet \
    --in-process --models googlenet --precisions bf16 --fractions 0.75,0.5,0.35,0.25 \
    --time-limit 135
