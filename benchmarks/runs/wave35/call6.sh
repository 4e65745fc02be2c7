#!/usr/bin/env bash
# Call 6: the call gap on VGG-16's cells nearest the step target from above: bf16 at its
# least budget (64 passes of 4; wave 32: 0.995) and fp32 at 25% (8 passes; wave 32: 1.069).
set -u
. benchmarks/stages.sh call6 215
stage matrix_vgg16 200 python3 scripts/matrix_gpu.py --out $OUT/matrix_vgg16 --in-process \
    --models vgg16 --precisions bf16,fp32 --fractions least,0.25 --time-limit 195
