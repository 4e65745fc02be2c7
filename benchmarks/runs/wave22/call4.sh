#!/usr/bin/env bash
# Call 4: ResNet-50 TF32 in 6 GiB (minidnn with whole-batch and with split statistics) beside
# PyTorch's gradient accumulation (channels_last, eager and compiled).
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
budget r50_tf32_6gib 540 --model resnet50 --batch 256 --math tf32 --caps 6GiB --accumulate 4,8 \
    --split-batch-statistics
cd /tmp/o && tar czf $FINAL/call4.tgz . ; cat stages.txt > $FINAL/log.txt
for f in */bench_budget.md; do echo "### $f"; cat $f; done >> $FINAL/log.txt 2>/dev/null
