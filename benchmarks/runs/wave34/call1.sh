#!/usr/bin/env bash
# Call 1: the fused pool's GPU tests and clock after its store was made one device function;
# AlexNet fp32's least cell traced, with every call set beside the step model, and the same
# 64 passes of 4 with no budget (nothing offloaded) traced the same way; GoogLeNet bf16's
# cells at 35 and 25%.
set -u
. benchmarks/stages.sh call1 555
stage gpu_tests 45 python3 -m pytest -q -p no:cacheprovider tests/test_pool_relu_gpu.py -k sum
stage pool_clock 45 python3 benchmarks/runs/wave32/pool_run_clock.py
stage matrix_alexnet_trace 130 python3 scripts/matrix_gpu.py --out $OUT/matrix_alexnet \
    --in-process --models alexnet --precisions fp32 --fractions least --trace --time-limit 125
stage alexnet_least_calls 40 python3 scripts/model_vs_trace.py \
    $OUT/matrix_alexnet/alexnet-fp32-least.trace.json \
    --report $OUT/matrix_alexnet/alexnet-fp32-least.json --top 60 \
    --json $OUT/matrix_alexnet/alexnet-fp32-least.calls.json
mkdir -p $OUT/alexnet_64
stage alexnet_64_free 70 python3 -m minidnn train --model alexnet --data synthetic \
    --batch 256 --steps 12 --precision fp32 --policy dyn --memory-budget 8GiB \
    --micro-batches 64 --relu-bits --eval-every 0 --eval-batches 1 --no-progress \
    --log-every 12 --report $OUT/alexnet_64/run.json --trace $OUT/alexnet_64/trace.json \
    --trace-held
stage alexnet_64_calls 40 python3 scripts/model_vs_trace.py $OUT/alexnet_64/trace.json \
    --report $OUT/alexnet_64/run.json --top 60 --json $OUT/alexnet_64/calls.json
stage matrix_googlenet_bf16 150 python3 scripts/matrix_gpu.py --out $OUT/matrix_googlenet \
    --in-process --models googlenet --precisions bf16 --fractions 0.35,0.25 --time-limit 145
