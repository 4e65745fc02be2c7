#!/usr/bin/env bash
# Call 5: ResNet-50 bf16 under 8 and 6 GiB (minidnn with whole-batch and with split
# statistics) beside PyTorch's gradient accumulation (channels_last + bf16 autocast, eager and
# compiled), and minidnn's own unconstrained bf16 step in the same call.
set -u
FINAL=$OUT; OUT=/tmp/o5; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 560 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
L=$(cap 70); timeout $L python3 scripts/bench_budget.py --model resnet50 --batch 256 --math bf16 \
    --caps none --only minidnn --steps 6 --warmup 4 --timeout 60 --time-limit $(( L - 5 )) \
    --out $OUT/r50_bf16_none > $OUT/r50_bf16_none.txt 2>&1; t r50_bf16_none
L=$(cap 490); timeout $L python3 scripts/bench_budget.py --model resnet50 --batch 256 --math bf16 \
    --caps 8GiB,6GiB --accumulate 2,4 --split-batch-statistics --segments "" \
    --layouts channels_last --no-whole-batch --steps 5 --warmup 4 --timeout 150 \
    --time-limit $(( L - 10 )) --out $OUT/r50_bf16_caps > $OUT/r50_bf16_caps.txt 2>&1; t r50_bf16_caps
cd $OUT && tar czf $FINAL/call5.tgz . ; cat stages.txt > $FINAL/log.txt
for f in */bench_budget.md; do echo "### $f"; cat $f; done >> $FINAL/log.txt 2>/dev/null
