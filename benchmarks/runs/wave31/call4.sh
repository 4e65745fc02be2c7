#!/usr/bin/env bash
# Call 4: the two cells the step model still predicts more than 10% slow (call 3), each
# budget cell's last step traced held beside the model's calls by layer kind.
set -u
. benchmarks/stages.sh call4 400
stage trace_overfeat 120 python3 scripts/matrix_gpu.py --out $OUT/trace_overfeat \
    --in-process --models overfeat --precisions bf16 --fractions least --trace --time-limit 110
stage trace_resnet50 200 python3 scripts/matrix_gpu.py --out $OUT/trace_resnet50 \
    --in-process --models resnet50 --precisions fp32 --statistics whole --fractions 0.5 \
    --trace --time-limit 190
