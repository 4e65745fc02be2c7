#!/usr/bin/env bash
# Call 1: the GPU tests of bf16 steps at their least budgets (with their error lines), then
# the combination matrix's ResNet-50 and VGG-16 rows (in one process).
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 560 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt 2>&1
timeout $(cap 150) python3 -m pytest -m gpu -p no:cacheprovider -rA --tb=short --durations=15 \
    tests/test_budget_gpu.py tests/test_budget_conv_plans.py tests/test_batchnorm_sums.py > $OUT/gpu_tests.txt 2>&1; t tests
L=$(cap 400); timeout $L python3 scripts/matrix_gpu.py --out $OUT/matrix --in-process \
    --models resnet50,vgg16 --precisions bf16,fp32 --time-limit $(( L - 20 )) > $OUT/matrix.txt 2>&1; t matrix
cd /tmp/o && rm -f matrix/*-probe.json && tar czf $FINAL/call1.tgz . ; cat stages.txt > $FINAL/log.txt
grep -E "passed|failed|FAILED|ERROR|Error|error" gpu_tests.txt | tail -40 >> $FINAL/log.txt; tail -45 matrix.txt >> $FINAL/log.txt
