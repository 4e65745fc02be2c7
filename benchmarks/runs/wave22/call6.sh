#!/usr/bin/env bash
# Call 6: ResNet-50 bf16 in 6 and 8 GiB with --split-batch-statistics, forced into 2 passes of
# 128 (dyn chose one pass in call 5), and the step model's prediction of each forced plan.
set -u
FINAL=$OUT; OUT=/tmp/o6; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 200 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
for B in 6GiB 8GiB; do
    timeout $(cap 100) python3 -m minidnn train --model resnet50 --batch 256 --precision bf16 \
        --policy dyn --relu-bits --memory-budget $B --split-batch-statistics --micro-batches 2 \
        --data synthetic --steps 10 --eval-every 0 --no-progress --log-every 10 \
        --report $OUT/r50_bf16_${B}_2x128.json > $OUT/r50_bf16_${B}_2x128.txt 2>&1
    timeout $(cap 40) python3 -m minidnn plan --report $OUT/r50_bf16_${B}_2x128.json \
        --micro-batches 2 >> $OUT/r50_bf16_${B}_2x128.txt 2>&1; t $B
done
cd $OUT && tar czf $FINAL/call6.tgz . ; cat stages.txt > $FINAL/log.txt
for f in *.txt; do echo "### $f"; tail -30 $f; done >> $FINAL/log.txt
