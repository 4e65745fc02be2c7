#!/usr/bin/env bash
# Call 5: a profile reads the cuDNN plan tables of the problems its step runs (the maps' layout
# and dtype; they were NCHW float32 problems): the GPU tests of the profile, conv1's tables
# again, and the plans of two of call 1's matrix cells made again from profiles measured so,
# beside those runs' replayed steps.
set -u
. benchmarks/stages.sh call5 230
stage gpu_tests 60 python3 -m pytest -q -p no:cacheprovider tests/test_profile_gpu.py
stage conv1_plans 40 python3 benchmarks/runs/wave24/conv1_plans.py --batches 4,32
stage plan_vgg16_bf16_50 50 python3 -m minidnn plan \
    --report benchmarks/runs/wave24/call1/vgg16_bf16_50.json
stage plan_resnet50_fp32_split_least 90 python3 -m minidnn plan \
    --report benchmarks/runs/wave24/call1/resnet50_fp32_split_least.json
