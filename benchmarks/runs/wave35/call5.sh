#!/usr/bin/env bash
# Call 5: GoogLeNet TF32 beside PyTorch's compiled channels_last step, with time for its
# compilation (it did not finish in wave 34's 175 s stage; eager ran there at 76.1 ms).
set -u
. benchmarks/stages.sh call5 430
stage bench_googlenet_tf32 410 python3 scripts/bench_vs_pytorch.py --runs googlenet:256:tf32 \
    --frameworks minidnn pytorch-cl-compiled --steps 10 --warmup 3 --timeout 405 \
    --out $OUT/bench_googlenet_tf32.json
