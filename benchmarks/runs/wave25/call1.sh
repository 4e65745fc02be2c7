#!/usr/bin/env bash
# Call 1: the profile with each convolution's weights laid out as the run lays them out
# (TIMING_METHOD 5; wave 24 timed channels-last convolutions with C-order weights): its GPU
# tests, conv1's backward under each plan setting timed three ways, and the three matrix cells
# the step model missed most, planned from profiles measured so, traced held, each beside the
# model and its plan.
set -u
. benchmarks/stages.sh call1 575
cell() {   # cell NAME SECONDS MODEL PRECISION BUDGET [flags]: a matrix cell, traced held
    local n=$1 s=$2 m=$3 p=$4 b=$5; shift 5
    stage $n $s python3 -m minidnn train --model $m --data synthetic --batch 256 --steps 8 \
        --device gpu --precision $p --policy dyn --relu-bits --memory-budget $b --eval-every 0 \
        --eval-batches 1 --no-progress --log-every 8 --report $OUT/$n.json \
        --trace $OUT/$n.trace.json --trace-held "$@"
    stage $n.compare 30 python3 scripts/model_vs_trace.py $OUT/$n.trace.json \
        --report $OUT/$n.json --top 25 --json $OUT/$n.compare.json
    stage $n.plan 40 python3 -m minidnn plan --report $OUT/$n.json
}
stage gpu_tests 60 python3 -m pytest -q -p no:cacheprovider tests/test_profile_gpu.py
stage conv1_clock 50 python3 benchmarks/runs/wave24/conv1_clock.py --batches 4,32
stage conv1_plans 40 python3 benchmarks/runs/wave24/conv1_plans.py --batches 4,32
cell vgg16_bf16_50 60 vgg16 bf16 3693622016
cell overfeat_fp32_least 60 overfeat fp32 2244120412
cell resnet50_fp32_split_least 150 resnet50 fp32 389021696 --split-batch-statistics
