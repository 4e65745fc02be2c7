#!/usr/bin/env bash
# Call 2: replayed steps of four combination-matrix cells kernel by kernel beside the step
# model (kernels.py); VGG-16 bf16 in 4 GiB beside PyTorch's gradient accumulation
# (channels_last, eager and compiled, at each accumulation count given).
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 560 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
budget() {   # budget NAME SECONDS ARGS...
    local name=$1 L=$(cap $2); shift 2
    timeout $L python3 scripts/bench_budget.py "$@" --segments "" --layouts channels_last \
        --no-whole-batch --steps 5 --warmup 4 --timeout 200 --time-limit $(( L - 10 )) \
        --out $OUT/$name > $OUT/$name.txt 2>&1; t $name
}
kern() {   # kern NAME SECONDS ARGS...
    local name=$1 L=$(cap $2); shift 2
    OUT=$OUT timeout $L python3 benchmarks/runs/wave22/kernels.py "$@" > $OUT/kernels_$name.txt 2>&1
    t kernels_$name
}
kern vgg16_bf16_50 60 vgg16 bf16 3693622016
kern overfeat_fp32_least 60 overfeat fp32 2244120412
kern alexnet_bf16_50 50 alexnet bf16 1028994944
kern resnet50_fp32_split_least 80 resnet50 fp32 389021696 split
budget vgg16_bf16_4gib 300 --model vgg16 --batch 256 --math bf16 --caps 4GiB --accumulate 4,8
cd /tmp/o && tar czf $FINAL/call2.tgz . ; cat stages.txt > $FINAL/log.txt
for f in kernels_*.txt */bench_budget.md; do echo "### $f"; cat $f; done >> $FINAL/log.txt 2>/dev/null
