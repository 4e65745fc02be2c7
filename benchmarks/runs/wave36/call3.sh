#!/usr/bin/env bash
# Call 3: GoogLeNet TF32 under 4 GiB beside PyTorch's accumulation 4 in the same call (call 1
# ran minidnn, call 2 PyTorch's accumulation 4 and 8); then VGG-16 fp32 at 75% with its last
# step traced held beside the model's calls (predicted 8-9% slow in 2, 4 and 8 passes).
set -u
. benchmarks/stages.sh call3 520
stage budget_googlenet_tf32_4gib 260 python3 scripts/bench_budget.py --model googlenet \
    --batch 256 --math tf32 --caps 4GiB --accumulate 4 --layouts channels_last --segments "" \
    --no-whole-batch --timeout 170 --time-limit 255 --out $OUT/budget_googlenet_tf32_4gib
stage trace_vgg16_fp32 230 python3 scripts/matrix_gpu.py --out $OUT/trace_vgg16_fp32 \
    --in-process --models vgg16 --precisions fp32 --fractions 0.75 --trace --time-limit 220
