#!/usr/bin/env bash
# Call 2: variants of the batch-norm kernels' source timed on ResNet-50's bf16 shapes from
# CUDA graphs (bn_variants.py), then every GPU test in one process.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 570 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
timeout $(cap 170) python3 benchmarks/runs/wave20/bn_variants.py > $OUT/bn_variants.txt 2>&1
t bn_variants
cp $OUT/bn_variants.txt $FINAL/
timeout $(cap 400) python3 -m pytest -m gpu -p no:cacheprovider -v -rfE --tb=short \
    --durations=20 tests > $OUT/gpu_tests.txt 2>&1; t tests
cd /tmp/o && tar czf $FINAL/call2.tgz . ; cat stages.txt > $FINAL/log.txt
grep -hE "FAILED|ERROR|passed|failed" gpu_tests.txt | tail -40 >> $FINAL/log.txt
grep -A8 "^| variant" bn_variants.txt >> $FINAL/log.txt
