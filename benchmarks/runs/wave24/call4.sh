#!/usr/bin/env bash
# Call 4: ResNet-50's conv1 backward under each plan setting, replayed from a graph (as the
# profile times it), held and plain, with the channels-last plan tables (call 3: the profile's
# memory-optimal backward 2.16 ms at 4 images, the held trace of a step 0.069 ms); GoogLeNet
# bf16 beside PyTorch's compiled step, which did not finish compiling in call 3's 110 s.
set -u
. benchmarks/stages.sh call4 300
stage conv1_clock 60 python3 benchmarks/runs/wave24/conv1_clock.py --batches 4,32
stage bench_googlenet_bf16 220 python3 scripts/bench_vs_pytorch.py --runs googlenet:256:bf16 \
    --frameworks minidnn pytorch-cl-bf16-compiled --steps 10 --warmup 3 --timeout 200 \
    --out $OUT/bench_googlenet_bf16.json
