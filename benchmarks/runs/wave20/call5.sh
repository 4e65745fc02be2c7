#!/usr/bin/env bash
# Call 5: does placing the add's kept gradient part at the top of the arena make a captured
# ResNet-50 bf16 step hold more than it needs? The steady peak with it there (this tree) and
# in best fit among the calls' blocks (.whl/manager_no_lasting.py: manager.py with that one
# `lasting()` removed), with no budget and at call 4's 50% cell (5652451328 bytes).
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
run() {   # name, extra arguments
    local name=$1; shift
    timeout 45 python3 -m minidnn train --model resnet50 --batch 256 --precision bf16 \
        --steps 8 --data synthetic --report $OUT/$name.json "$@" > $OUT/$name.txt 2>&1
    python3 -c "import json,sys; r=json.load(open('$OUT/$name.json')); m=r['memory']; print('$name', 'steady peak', m['steady_peak_device_bytes'], 'in use', m['device_in_use_bytes'], 'img/s', round(r['images_per_s']), 'graphs', r.get('step_graphs'))" >> $OUT/peaks.txt 2>&1 || echo "$name failed: $(tail -2 $OUT/$name.txt)" >> $OUT/peaks.txt
    t $name
}
B="--policy dyn --relu-bits --memory-budget 5652451328"
cp minidnn/memory/manager.py /tmp/manager_top.py
cp .whl/manager_no_lasting.py minidnn/memory/manager.py
run bestfit_none
run bestfit_50 $B
cp /tmp/manager_top.py minidnn/memory/manager.py
run top_none
cd /tmp/o && tar czf $FINAL/call5.tgz . ; cat stages.txt peaks.txt > $FINAL/log.txt
