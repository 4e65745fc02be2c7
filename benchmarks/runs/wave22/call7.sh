#!/usr/bin/env bash
# Call 7: ResNet-50 bf16 in 6 GiB with --split-batch-statistics, dyn choosing freely, after
# split options predicted close to the chosen one are planned again from their own profiles.
set -u
FINAL=$OUT; OUT=/tmp/o7; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
timeout 100 python3 -m minidnn train --model resnet50 --batch 256 --precision bf16 \
    --policy dyn --relu-bits --memory-budget 6GiB --split-batch-statistics \
    --data synthetic --steps 10 --eval-every 0 --no-progress --log-every 10 \
    --report $OUT/r50_bf16_6GiB.json > $OUT/r50_bf16_6GiB.txt 2>&1
timeout 60 python3 -m minidnn plan --report $OUT/r50_bf16_6GiB.json >> $OUT/r50_bf16_6GiB.txt 2>&1
cd $OUT && tar czf $FINAL/call7.tgz . ; tail -32 r50_bf16_6GiB.txt > $FINAL/log.txt
