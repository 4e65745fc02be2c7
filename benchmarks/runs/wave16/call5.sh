#!/usr/bin/env bash
# Call 5: ResNet-50 bf16 under an ample budget (nothing offloaded): the step model's predicted
# step beside the measured one, and the profile it planned from (to replay the prediction
# on a CPU).
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT/cache
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
timeout 150 python3 -m minidnn train --model resnet50 --data synthetic --batch 256 --steps 12 \
    --device gpu --precision bf16 --policy dyn --memory-budget 30GiB --relu-bits \
    --eval-every 0 --eval-batches 1 --no-progress --log-every 12 --report $OUT/r50.json \
    > $OUT/train.txt 2>&1
timeout 60 python3 -m minidnn plan --json --model resnet50 --batch 256 --precision bf16 \
    --num-classes 1000 --relu-bits --report $OUT/r50.json > $OUT/plan.json 2> $OUT/plan.err
find /tmp/cache -name "*.json" -exec cp {} $OUT/cache/ \;
cd /tmp/o && tar czf $FINAL/call5.tgz . ; tail -3 train.txt > $FINAL/log.txt
python3 -c "import json; r=json.load(open('plan.json'))['comparison']['rows']; print([ (x['quantity'], x['predicted'], x['measured']) for x in r])" >> $FINAL/log.txt 2>&1
