#!/usr/bin/env bash
# Call 2: the GPU tests of bf16 steps at their least budgets (the matrix product's float32
# output now planned, its bias gradient summed without a copy) and of the changed kernels;
# the probe of cuDNN's convolution fusions; the matrix's VGG-16 fp32 and AlexNet fp32 rows
# and OverFeat's least budgets (the gradient adds of micro-batches now in the step model).
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 555 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
timeout $(cap 150) python3 -m pytest -m gpu -p no:cacheprovider -rfE --tb=short --durations=5 \
    tests/test_budget_gpu.py tests/test_budget_conv_plans.py tests/test_bf16_gpu.py \
    tests/test_pointwise_gpu.py tests/test_layers_gpu.py > $OUT/gpu_tests.txt 2>&1; t tests
timeout $(cap 110) python3 benchmarks/runs/wave15/probe_fusion.py > $OUT/probe.txt 2>&1; t probe
timeout $(cap 90) python3 scripts/matrix_gpu.py --out $OUT/overfeat --in-process \
    --models overfeat --precisions bf16,fp32 --fractions least --time-limit 85 > $OUT/overfeat.txt 2>&1; t overfeat
L=$(cap 250); timeout $L python3 scripts/matrix_gpu.py --out $OUT/matrix --in-process \
    --models vgg16,alexnet --precisions fp32 --time-limit $(( L - 8 )) > $OUT/matrix.txt 2>&1; t matrix
cd /tmp/o && rm -f */*-probe.json && tar czf $FINAL/call2.tgz . ; cat stages.txt > $FINAL/log.txt
grep -E "passed|failed|FAILED|ERROR|Error" gpu_tests.txt | tail -30 >> $FINAL/log.txt
cat probe.txt >> $FINAL/log.txt; tail -8 overfeat.txt >> $FINAL/log.txt; tail -25 matrix.txt >> $FINAL/log.txt
