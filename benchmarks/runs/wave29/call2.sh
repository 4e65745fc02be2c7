#!/usr/bin/env bash
# Call 2: the first update takes no temporary and the step model counts none; a split step
# computes its fully connected layers' gradients once (minidnn/gathered.py). The GPU tests of
# both; VGG-16 TF32 in 4 GiB with and without the gathered gradients (one decision, one
# process), then beside PyTorch's compiled accumulation of 8 and both unconstrained steps;
# AlexNet's rows of the combination matrix again (its predicted peak had held fc6's
# temporary, 139 MiB over the measured steady peak in call 1).
set -u
. benchmarks/stages.sh call2 570
stage gpu_tests 130 python3 -m pytest -q -p no:cacheprovider tests/test_sgd_update_gpu.py \
    tests/test_gathered_gpu.py tests/test_micro_batches_gpu.py tests/test_budget_gpu.py
stage gathered_clock 110 python3 benchmarks/runs/wave29/gathered_clock.py --model vgg16 \
    --batch 256 --budget 4GiB --math tf32
stage budget_vgg16_tf32 200 python3 scripts/bench_budget.py --model vgg16 --batch 256 \
    --math tf32 --caps none,4GiB --accumulate 8 --layouts channels_last --segments "" \
    --no-whole-batch --timeout 90 --time-limit 190 --out $OUT/budget_vgg16_tf32
stage matrix_alexnet 110 python3 scripts/matrix_gpu.py --out $OUT/matrix --in-process \
    --models alexnet --precisions bf16,fp32 --fractions 0.5,least --time-limit 100
