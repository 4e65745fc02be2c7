#!/usr/bin/env bash
# Call 1: every GPU test in one process; ResNet-50 bf16 beside compiled PyTorch, profiled;
# the batch-norm kernels' bandwidth on ResNet-50's shapes.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 540 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
timeout $(cap 290) python3 -m pytest -m gpu -p no:cacheprovider -q -rfE --tb=short tests \
    > $OUT/gpu_tests.txt 2>&1; t tests
timeout $(cap 150) python3 scripts/bench_vs_pytorch.py --runs resnet50:256:bf16 \
    --frameworks minidnn pytorch-cl-bf16-compiled --steps 10 --warmup 3 --profile \
    --timeout 140 --out $OUT/bench_resnet50_bf16.json > $OUT/bench_resnet50_bf16.txt 2>&1
t resnet50
timeout $(cap 100) python3 scripts/bn_bandwidth.py --repeats 10 > $OUT/bn_bandwidth.txt 2>&1
t bn_bandwidth
cd /tmp/o && tar czf $FINAL/call1.tgz . ; cat stages.txt > $FINAL/log.txt
grep -hE "FAILED|ERROR|passed|failed" gpu_tests.txt | tail -40 >> $FINAL/log.txt
grep -E "^\| [a-z]" bench_resnet50_bf16.txt >> $FINAL/log.txt
tail -30 bn_bandwidth.txt >> $FINAL/log.txt
