#!/usr/bin/env bash
# Call 1: the GPU tests of bf16 steps at their least budgets (lasting blocks from the arena's
# top), a probe of the convolution fusions cuDNN offers, VGG-16 bf16 at 35% and 25% with CUDA
# graphs, then the matrix's OverFeat rows with the time left.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 555 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt 2>&1
timeout $(cap 150) python3 -m pytest -m gpu -p no:cacheprovider -rA --tb=short --durations=10 \
    tests/test_budget_gpu.py tests/test_budget_conv_plans.py tests/test_batchnorm_sums.py \
    tests/test_arena_lasting.py > $OUT/gpu_tests.txt 2>&1; t tests
timeout $(cap 130) python3 benchmarks/runs/wave15/probe_fusion.py > $OUT/probe.txt 2>&1; t probe
timeout $(cap 110) python3 scripts/matrix_gpu.py --out $OUT/vgg_bf16 --in-process \
    --models vgg16 --precisions bf16 --fractions 0.35,0.25 --time-limit 100 > $OUT/vgg_bf16.txt 2>&1; t vgg_bf16
L=$(cap 200); timeout $L python3 scripts/matrix_gpu.py --out $OUT/matrix --in-process \
    --models overfeat --precisions bf16,fp32 --time-limit $(( L - 8 )) > $OUT/matrix.txt 2>&1; t matrix
cd /tmp/o && rm -f */*-probe.json && tar czf $FINAL/call1.tgz . ; cat stages.txt > $FINAL/log.txt
grep -E "passed|failed|FAILED|ERROR|Error|error" gpu_tests.txt | tail -30 >> $FINAL/log.txt
cat probe.txt >> $FINAL/log.txt; tail -12 vgg_bf16.txt >> $FINAL/log.txt; tail -25 matrix.txt >> $FINAL/log.txt
