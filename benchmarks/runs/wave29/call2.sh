#!/usr/bin/env bash
# Call 2: the first update takes no temporary and the step model counts none. The GPU tests
# of the update and of training at the least budgets; the combination matrix's rows of
# AlexNet, OverFeat and VGG-16 again (their predicted peaks had held the largest weight's
# temporary: 0.1-0.4 GiB over the measured steady peak in call 1).
set -u
. benchmarks/stages.sh call2 570
stage gpu_tests 110 python3 -m pytest -q -p no:cacheprovider tests/test_sgd_update_gpu.py \
    tests/test_budget_gpu.py
stage matrix 440 python3 scripts/matrix_gpu.py --out $OUT/matrix --in-process \
    --models alexnet,overfeat,vgg16 --precisions bf16,fp32 --fractions 0.5,least \
    --time-limit 425
