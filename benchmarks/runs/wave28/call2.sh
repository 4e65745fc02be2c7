#!/usr/bin/env bash
# Call 2: dyn weighs ReLU bit masks against the plan without them. The budget GPU tests; VGG-16
# in 4 GiB (TF32, then bf16) beside PyTorch's compiled accumulation of 8 and both frameworks'
# unconstrained steps; `minidnn plan` of each from the profiles measured there (kept).
set -u
. benchmarks/stages.sh call2 570
stage gpu_tests 80 python3 -m pytest -q -p no:cacheprovider tests/test_budget_gpu.py
stage budget_vgg16_tf32 190 python3 scripts/bench_budget.py --model vgg16 --batch 256 \
    --math tf32 --caps none,4GiB --accumulate 8 --layouts channels_last --segments "" \
    --no-whole-batch --timeout 90 --time-limit 180 --out $OUT/budget_vgg16_tf32
stage plan_vgg16_tf32 30 python3 -m minidnn plan --model vgg16 --batch 256 \
    --memory-budget 4GiB --relu-bits
stage budget_vgg16_bf16 190 python3 scripts/bench_budget.py --model vgg16 --batch 256 \
    --math bf16 --caps none,4GiB --accumulate 8 --layouts channels_last --segments "" \
    --no-whole-batch --timeout 90 --time-limit 180 --out $OUT/budget_vgg16_bf16
stage plan_vgg16_bf16 30 python3 -m minidnn plan --model vgg16 --batch 256 \
    --memory-budget 4GiB --relu-bits --precision bf16
stage profiles 10 cp -r "$MINIDNN_CACHE/profiles" "$OUT/profiles"
