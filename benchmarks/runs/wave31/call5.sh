#!/usr/bin/env bash
# Call 5: the step model prices a ReLU that its batch norm or add applies at nothing in
# forward (it had priced it as a pass of its own): ResNet-50's matrix cells with one pass
# (fp32 at 50%, predicted 10.7% slow in call 3; bf16 at 50% and its least budget) and bf16
# with split statistics at its least budget; bf16 with whole-batch statistics in 8 GiB.
set -u
. benchmarks/stages.sh call5 450
stage matrix_fp32 90 python3 scripts/matrix_gpu.py --out $OUT/matrix_fp32 --in-process \
    --models resnet50 --precisions fp32 --statistics whole --fractions 0.5 --time-limit 85
stage matrix_bf16 120 python3 scripts/matrix_gpu.py --out $OUT/matrix_bf16 --in-process \
    --models resnet50 --precisions bf16 --statistics whole --fractions 0.5,least \
    --time-limit 115
stage matrix_bf16_split 150 python3 scripts/matrix_gpu.py --out $OUT/matrix_bf16_split \
    --in-process --models resnet50 --precisions bf16 --statistics split --fractions least \
    --time-limit 145
stage resnet50_bf16 70 python3 scripts/bench_budget.py --model resnet50 --batch 256 \
    --math bf16 --caps none,8GiB --only minidnn --layouts channels_last --segments "" \
    --no-whole-batch --timeout 60 --time-limit 65 --out $OUT/resnet50_bf16
