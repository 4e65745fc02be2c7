#!/usr/bin/env bash
# Call 3: the cells of 64 passes of 4 the step model predicted more than 10% fast (calls 1
# and 2: AlexNet bf16 0.88, GoogLeNet bf16 with chunks 0.73, ResNet-50 bf16 with split
# statistics 0.70), each budget cell's last step traced held, beside the model's calls by
# layer kind.
set -u
. benchmarks/stages.sh call3 400
stage trace_alexnet 80 python3 scripts/matrix_gpu.py --out $OUT/trace_alexnet --in-process \
    --models alexnet --precisions bf16 --fractions least --trace --time-limit 75
stage trace_googlenet 130 python3 scripts/matrix_gpu.py --out $OUT/trace_googlenet \
    --in-process --models googlenet --precisions bf16 --fractions least --trace --time-limit 80
stage trace_resnet50 170 python3 scripts/matrix_gpu.py --out $OUT/trace_resnet50 \
    --in-process --models resnet50 --precisions bf16 --fractions least --trace --time-limit 100
