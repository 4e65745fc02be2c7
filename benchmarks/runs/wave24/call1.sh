#!/usr/bin/env bash
# Call 1: the GPU tests of wave 23's unrun paths (captured steps giving their blocks back to a
# traced step and evaluations; the flat join of bf16 pieces; the deterministic loss in every
# split); whether cuDNN has a TF32 convolution with batch-norm statistics; ResNet-50 TF32 beside
# PyTorch's compiled step, kernels by class; the three matrix cells the step model misses most
# at passes of a few images, traced held, each beside the model.
set -u
. benchmarks/stages.sh call1 575
cell() {   # cell NAME SECONDS MODEL PRECISION BUDGET [flags]: a wave-22 matrix cell, traced held
    local n=$1 s=$2 m=$3 p=$4 b=$5; shift 5
    stage $n $s python3 -m minidnn train --model $m --data synthetic --batch 256 --steps 8 \
        --device gpu --precision $p --policy dyn --relu-bits --memory-budget $b --eval-every 0 \
        --eval-batches 1 --no-progress --log-every 8 --report $OUT/$n.json \
        --trace $OUT/$n.trace.json --trace-held "$@"
    stage $n.compare 40 python3 scripts/model_vs_trace.py $OUT/$n.trace.json \
        --report $OUT/$n.json --top 25 --json $OUT/$n.compare.json
}
stage gpu_tests 130 python3 -m pytest -q -p no:cacheprovider tests/test_budget_gpu.py \
    tests/test_bf16_kernels_gpu.py tests/test_runs_gpu.py tests/test_deterministic_gpu.py \
    -k "traced_step or held or concat or micro_batches_1_2_4 or every_policy_and_budget"
stage conv_bn_probe 60 python3 benchmarks/runs/wave17/conv_bn_probe.py --dtype fp32 \
    --time-limit 50 --modes A,FALLBACK
stage bench_resnet50_tf32 200 python3 scripts/bench_vs_pytorch.py --runs resnet50:256:tf32 \
    --frameworks minidnn pytorch-cl-compiled --steps 10 --warmup 3 --profile --timeout 150 \
    --out $OUT/bench_resnet50_tf32.json
cell vgg16_bf16_50 50 vgg16 bf16 3693622016
cell overfeat_fp32_least 60 overfeat fp32 2244120412
cell resnet50_fp32_split_least 120 resnet50 fp32 389021696 --split-batch-statistics
