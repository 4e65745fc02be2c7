#!/usr/bin/env bash
# Call 1: ResNet-50 b256 in bf16 and TF32, minidnn beside PyTorch's eager and compiled
# channels-last steps of the same precision, all in this one call.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 570 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
timeout $(cap 285) python3 scripts/bench_vs_pytorch.py --runs resnet50:256:bf16 \
    --frameworks minidnn pytorch-cl-bf16 pytorch-cl-bf16-compiled --steps 10 --warmup 3 \
    --timeout 220 --out $OUT/bench_resnet50_bf16.json > $OUT/bench_resnet50_bf16.txt 2>&1
t resnet50_bf16
timeout $(cap 285) python3 scripts/bench_vs_pytorch.py --runs resnet50:256:tf32 \
    --frameworks minidnn pytorch-cl pytorch-cl-compiled --steps 10 --warmup 3 \
    --timeout 220 --out $OUT/bench_resnet50_tf32.json > $OUT/bench_resnet50_tf32.txt 2>&1
t resnet50_tf32
cd /tmp/o && tar czf $FINAL/call1.tgz . ; cat stages.txt > $FINAL/log.txt
grep -hE "^\| [a-z]" bench_resnet50_*.txt >> $FINAL/log.txt
