#!/usr/bin/env bash
# Call 3: the GPU tests again (the losses a step holds now counted; the NCHW bf16 bias
# gradient's reduction), AlexNet fp32 at its least budget, then AlexNet and OverFeat beside
# PyTorch's channels_last eager and compiled steps in TF32 and bf16.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 420 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
timeout $(cap 110) python3 -m pytest -m gpu -p no:cacheprovider -rfE --tb=short --durations=5 \
    tests/test_budget_gpu.py tests/test_budget_conv_plans.py tests/test_bf16_gpu.py \
    tests/test_pointwise_gpu.py > $OUT/gpu_tests.txt 2>&1; t tests
timeout $(cap 60) python3 scripts/matrix_gpu.py --out $OUT/alexnet --in-process \
    --models alexnet --precisions fp32 --fractions least --time-limit 55 > $OUT/alexnet.txt 2>&1; t alexnet
timeout $(cap 300) python3 scripts/bench_vs_pytorch.py --runs alexnet:256:tf32 alexnet:256:bf16 \
    overfeat:256:tf32 overfeat:256:bf16 --frameworks minidnn pytorch-cl pytorch-cl-compiled \
    --steps 10 --warmup 3 --timeout 100 --out $OUT/bench.json > $OUT/bench.txt 2>&1; t bench
cd /tmp/o && rm -f */*-probe.json && tar czf $FINAL/call3.tgz . ; cat stages.txt > $FINAL/log.txt
grep -E "passed|failed|FAILED|ERROR|Error" gpu_tests.txt | tail -20 >> $FINAL/log.txt
tail -6 alexnet.txt | cut -c1-400 >> $FINAL/log.txt; tail -16 bench.txt >> $FINAL/log.txt
