#!/usr/bin/env bash
# Call 3: the gathered gradients' GPU tests with two device batches in turn (call 2's steps,
# each a new host batch, replayed no graph); the combination matrix's rows of OverFeat and
# VGG-16 with the optimizer's temporary gone and the gathered gradients (their predicted peaks
# had held 0.37-0.38 GiB over the measured steady peak in call 1).
set -u
. benchmarks/stages.sh call3 500
stage gpu_tests 60 python3 -m pytest -q -p no:cacheprovider tests/test_gathered_gpu.py
stage matrix 410 python3 scripts/matrix_gpu.py --out $OUT/matrix --in-process \
    --models overfeat,vgg16 --precisions bf16,fp32 --fractions 0.5,least --time-limit 400
