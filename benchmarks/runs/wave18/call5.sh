#!/usr/bin/env bash
# Call 5: Flatten's copy of channels-last maps in a planned scratch block: the whole-run GPU
# tests of tiny_cnn (channels-last maps, a Flatten in place: budgets, evaluations, traces).
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
timeout 120 python3 -m pytest -m gpu -p no:cacheprovider -q -rfE --tb=short \
    tests/test_runs_gpu.py -k "measured_profile or trace or resume or host_batches" \
    > $OUT/gpu_tests.txt 2>&1; t tests
cd /tmp/o && tar czf $FINAL/call5.tgz . ; cat stages.txt > $FINAL/log.txt
grep -hE "FAILED|ERROR|passed|failed" gpu_tests.txt | tail -30 >> $FINAL/log.txt
