#!/usr/bin/env bash
# Call 5: OverFeat in both precisions and GoogLeNet TF32 beside PyTorch's eager and compiled
# channels_last steps, one call (their last ratios are of the twenty-first to twenty-fourth
# waves' code).
set -u
. benchmarks/stages.sh call5 460
bench() {   # bench NAME SECONDS RUN FRAMEWORK...: minidnn beside PyTorch, one run
    local n=$1 s=$2 r=$3; shift 3
    stage bench_$n $s python3 scripts/bench_vs_pytorch.py --runs $r --frameworks minidnn "$@" \
        --steps 10 --warmup 3 --timeout $((s - 5)) --out $OUT/bench_$n.json
}
bench overfeat_tf32 130 overfeat:256:tf32 pytorch-cl pytorch-cl-compiled
bench overfeat_bf16 130 overfeat:256:bf16 pytorch-cl-bf16 pytorch-cl-bf16-compiled
bench googlenet_tf32 180 googlenet:256:tf32 pytorch-cl pytorch-cl-compiled
