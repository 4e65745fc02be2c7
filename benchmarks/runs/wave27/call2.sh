#!/usr/bin/env bash
# Call 2: the GPU tests of the products that add in place and of the default math; VGG-16 in
# 4 GiB (TF32 and bf16) beside PyTorch's accumulation of 4, 8 and 16 (eager and compiled),
# each framework's unconstrained step beside it.
set -u
. benchmarks/stages.sh call2 570
stage gpu_tests 80 python3 -m pytest -q -p no:cacheprovider tests/test_linear_add_gpu.py \
    tests/test_micro_batches_gpu.py tests/test_deterministic_gpu.py
stage budget_vgg16_tf32 250 python3 scripts/bench_budget.py --model vgg16 --batch 256 \
    --math tf32 --caps none,4GiB --accumulate 4,8,16 --layouts channels_last --segments "" \
    --no-whole-batch --timeout 100 --time-limit 240 --out $OUT/budget_vgg16_tf32
stage budget_vgg16_bf16 220 python3 scripts/bench_budget.py --model vgg16 --batch 256 \
    --math bf16 --caps 4GiB --accumulate 4,8,16 --layouts channels_last --segments "" \
    --no-whole-batch --timeout 90 --time-limit 210 --out $OUT/budget_vgg16_bf16
