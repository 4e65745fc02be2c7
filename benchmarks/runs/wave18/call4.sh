#!/usr/bin/env bash
# Call 4: the GPU tests that failed in call 3, after their fixes; VGG-16 TF32 in 4 GiB beside
# PyTorch's accumulation of 8 x 32, eager and compiled.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 470 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
timeout $(cap 250) python3 -m pytest -m gpu -p no:cacheprovider -q -rfE --tb=short \
    tests/test_pool_relu_gpu.py tests/test_memory_gpu.py tests/test_nets.py \
    tests/test_runs_gpu.py > $OUT/gpu_tests.txt 2>&1; t tests
timeout $(cap 215) python3 scripts/bench_budget.py --model vgg16 --batch 256 --math tf32 \
    --caps 4GiB --accumulate 8 --segments "" --layouts channels_last --no-whole-batch \
    --timeout 100 --time-limit 210 --out $OUT/budget_vgg16_tf32_4gib \
    > $OUT/budget_vgg16_tf32_4gib.txt 2>&1; t budget
cd /tmp/o && tar czf $FINAL/call4.tgz . ; cat stages.txt > $FINAL/log.txt
grep -hE "FAILED|ERROR|passed|failed" gpu_tests.txt | tail -60 >> $FINAL/log.txt
tail -14 budget_vgg16_tf32_4gib.txt >> $FINAL/log.txt
