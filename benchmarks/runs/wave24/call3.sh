#!/usr/bin/env bash
# Call 3: ResNet-50's conv1 measured alone under each plan setting at the batches of a pass
# (the step model priced its memory-optimal backward at 7.0 ms at passes of 4, the held trace
# 0.069 ms); the networks whose ratio to PyTorch's compiled step was not measured in one call
# (AlexNet in both precisions, GoogLeNet bf16) or is under 1.1x (OverFeat and VGG-16 TF32).
set -u
. benchmarks/stages.sh call3 520
bench() {   # bench NAME SECONDS RUN FRAMEWORK...: minidnn beside PyTorch, one run
    local n=$1 s=$2 r=$3; shift 3
    stage bench_$n $s python3 scripts/bench_vs_pytorch.py --runs $r --frameworks minidnn "$@" \
        --steps 10 --warmup 3 --timeout $((s - 5)) --out $OUT/bench_$n.json
}
stage conv1_plans 60 python3 benchmarks/runs/wave24/conv1_plans.py --batches 4,32,256
bench alexnet_tf32 90 alexnet:256:tf32 pytorch-cl-compiled
bench alexnet_bf16 90 alexnet:256:bf16 pytorch-cl-bf16-compiled
bench overfeat_tf32 90 overfeat:256:tf32 pytorch-cl-compiled
bench googlenet_bf16 110 googlenet:256:bf16 pytorch-cl-bf16-compiled
bench vgg16_tf32 100 vgg16:256:tf32 pytorch-cl-compiled
