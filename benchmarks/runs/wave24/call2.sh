#!/usr/bin/env bash
# Call 2: a residual add writes its masked gradient once and the batch norm before it reads it
# on (bn_grad): its GPU tests (the kernel against NumPy, fused steps against --no-fuse), and
# ResNet-50 in TF32 and bf16 beside PyTorch's compiled step (TF32 kernels by class); the held
# trace's first pass held long (its GPU test failed in call 1); the three matrix cells the
# step model misses most at passes of a few images, traced held, each beside the model on the
# GPU that ran it (call 1's comparisons found their traces gzipped by the packing).
set -u
. benchmarks/stages.sh call2 575
cell() {   # cell NAME SECONDS MODEL PRECISION BUDGET [flags]: a wave-22 matrix cell, traced held
    local n=$1 s=$2 m=$3 p=$4 b=$5; shift 5
    stage $n $s python3 -m minidnn train --model $m --data synthetic --batch 256 --steps 5 \
        --device gpu --precision $p --policy dyn --relu-bits --memory-budget $b --eval-every 0 \
        --eval-batches 1 --no-progress --log-every 5 --report $OUT/$n.json \
        --trace $OUT/$n.trace.json --trace-held "$@"
    stage $n.compare 60 python3 scripts/model_vs_trace.py $OUT/$n.trace.json \
        --report $OUT/$n.json --top 25 --json $OUT/$n.compare.json
}
stage gpu_tests 120 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_add_relu.py \
    tests/test_gpu_batchnorm_fused.py tests/test_runs_gpu.py tests/test_deterministic_gpu.py \
    -k "add_relu or sum or batch_norm or fused or held or resnet"
stage bench_resnet50_tf32 120 python3 scripts/bench_vs_pytorch.py --runs resnet50:256:tf32 \
    --frameworks minidnn pytorch-cl-compiled --steps 10 --warmup 3 --profile --timeout 100 \
    --out $OUT/bench_resnet50_tf32.json
stage bench_resnet50_bf16 100 python3 scripts/bench_vs_pytorch.py --runs resnet50:256:bf16 \
    --frameworks minidnn pytorch-cl-bf16-compiled --steps 10 --warmup 3 --timeout 90 \
    --out $OUT/bench_resnet50_bf16.json
cell vgg16_bf16_50 40 vgg16 bf16 3693622016
cell overfeat_fp32_least 50 overfeat fp32 2244120412
cell resnet50_fp32_split_least 120 resnet50 fp32 389021696 --split-batch-statistics
