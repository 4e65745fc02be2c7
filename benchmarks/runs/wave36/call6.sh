#!/usr/bin/env bash
# Call 6: ResNet-50 TF32, the one step left short of 1.1x compiled PyTorch, beside it again at
# this tree (last measured unconstrained in wave 25), with its kernels by class; and how close
# each float32 batch-norm pass on its shapes comes to memory speed.
set -u
. benchmarks/stages.sh call6 225
stage bench_resnet50_tf32 150 python3 scripts/bench_vs_pytorch.py --runs resnet50:256:tf32 \
    --frameworks minidnn pytorch-cl-compiled --steps 10 --warmup 3 --profile --timeout 140 \
    --out $OUT/bench_resnet50_tf32.json
stage bn_bandwidth_fp32 55 python3 scripts/bn_bandwidth.py --model resnet50 --batch 256 \
    --precision fp32
