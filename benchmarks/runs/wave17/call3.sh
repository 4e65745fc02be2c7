#!/usr/bin/env bash
# Call 3: every GPU test after the column passes' change; GoogLeNet (bf16, TF32), OverFeat
# TF32 and AlexNet bf16 beside compiled PyTorch.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 540 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
timeout $(cap 170) python3 -m pytest -m gpu -p no:cacheprovider -q -rfE --tb=short tests \
    > $OUT/gpu_tests.txt 2>&1; t tests
for run in googlenet:256:bf16 overfeat:256:tf32 googlenet:256:tf32 alexnet:256:bf16; do
  timeout $(cap 100) python3 scripts/bench_vs_pytorch.py --runs $run \
      --frameworks minidnn pytorch-cl-compiled --steps 10 --warmup 3 \
      --timeout 95 --out $OUT/bench_${run//:/_}.json > $OUT/bench_${run//:/_}.txt 2>&1; t $run
done
cd /tmp/o && tar czf $FINAL/call3.tgz . ; cat stages.txt > $FINAL/log.txt
grep -E "passed|failed|^FAILED|^ERROR" gpu_tests.txt | tail -30 >> $FINAL/log.txt
for f in bench_*.txt; do grep -E "^\| [a-z]" $f >> $FINAL/log.txt; done
