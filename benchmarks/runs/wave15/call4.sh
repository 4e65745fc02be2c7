#!/usr/bin/env bash
# Call 4: the GPU tests of bf16 steps at their least budgets (the ring of replayed losses now
# made before the first capture), then whole steps beside PyTorch's channels_last compiled
# step (and eager for VGG-16) in TF32 and bf16: VGG-16, ResNet-50, GoogLeNet.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 535 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
timeout $(cap 70) python3 -m pytest -m gpu -p no:cacheprovider -rfE --tb=short \
    tests/test_budget_gpu.py tests/test_budget_conv_plans.py > $OUT/gpu_tests.txt 2>&1; t tests
timeout $(cap 160) python3 scripts/bench_vs_pytorch.py --runs vgg16:256:tf32 vgg16:256:bf16 \
    --frameworks minidnn pytorch-cl pytorch-cl-compiled --steps 10 --warmup 3 --timeout 75 \
    --out $OUT/bench_vgg.json > $OUT/bench_vgg.txt 2>&1; t bench_vgg
timeout $(cap 330) python3 scripts/bench_vs_pytorch.py --runs resnet50:256:bf16 resnet50:256:tf32 \
    googlenet:256:bf16 --frameworks minidnn pytorch-cl-compiled --steps 10 --warmup 3 \
    --timeout 150 --out $OUT/bench_r50_goog.json > $OUT/bench_r50_goog.txt 2>&1; t bench_r50_goog
cd /tmp/o && tar czf $FINAL/call4.tgz . ; cat stages.txt > $FINAL/log.txt
grep -E "passed|failed|FAILED|ERROR|Error" gpu_tests.txt | tail -12 >> $FINAL/log.txt
tail -9 bench_vgg.txt >> $FINAL/log.txt; tail -9 bench_r50_goog.txt >> $FINAL/log.txt
