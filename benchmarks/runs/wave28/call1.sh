#!/usr/bin/env bash
# Call 1: the GPU tests whose run helper changed after wave 26's calls; VGG-16 TF32 in 4 GiB
# with and without ReLU bit masks (with bit masks, beside PyTorch's compiled accumulation of
# 8 and both frameworks' unconstrained steps), and one replayed step of the plan without them.
set -u
. benchmarks/stages.sh call1 570
stage gpu_tests 110 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_add_relu.py \
    tests/test_profile_gpu.py tests/test_conv_relu_gpu.py
stage budget_vgg16_tf32 230 python3 scripts/bench_budget.py --model vgg16 --batch 256 \
    --math tf32 --caps none,4GiB --accumulate 8 --layouts channels_last --segments "" \
    --no-whole-batch --timeout 100 --time-limit 220 --out $OUT/budget_vgg16_tf32
stage budget_vgg16_tf32_nobits 110 python3 scripts/bench_budget.py --model vgg16 --batch 256 \
    --math tf32 --caps 4GiB --only minidnn --no-relu-bits --timeout 100 --time-limit 100 \
    --out $OUT/budget_vgg16_tf32_nobits
stage kernels_vgg16_tf32_4gib_nobits 90 python3 scripts/step_kernels.py --model vgg16 \
    --memory-budget 4GiB --no-relu-bits --top 40
