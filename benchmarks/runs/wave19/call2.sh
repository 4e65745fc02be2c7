#!/usr/bin/env bash
# Call 2: batch-norm sums in short float32 runs: the GPU tests that run batch norms, their
# bandwidth on ResNet-50's shapes, ResNet-50 bf16 and TF32 beside compiled PyTorch.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 540 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
timeout $(cap 150) python3 -m pytest -m gpu -p no:cacheprovider -q -rfE --tb=short \
    tests/test_gpu_batchnorm_fused.py tests/test_bf16_kernels_gpu.py tests/test_gpu_add_relu.py \
    tests/test_batchnorm.py tests/test_deterministic_gpu.py tests/test_step_graph_gpu.py \
    > $OUT/gpu_tests.txt 2>&1; t tests
timeout $(cap 60) python3 scripts/bn_bandwidth.py --repeats 10 > $OUT/bn_bandwidth.txt 2>&1
t bn_bandwidth
timeout $(cap 140) python3 scripts/bench_vs_pytorch.py --runs resnet50:256:bf16 \
    --frameworks minidnn pytorch-cl-bf16-compiled --steps 10 --warmup 3 --profile \
    --timeout 130 --out $OUT/bench_resnet50_bf16.json > $OUT/bench_resnet50_bf16.txt 2>&1
t resnet50_bf16
timeout $(cap 140) python3 scripts/bench_vs_pytorch.py --runs resnet50:256:tf32 \
    --frameworks minidnn pytorch-cl-compiled --steps 10 --warmup 3 \
    --timeout 130 --out $OUT/bench_resnet50_tf32.json > $OUT/bench_resnet50_tf32.txt 2>&1
t resnet50_tf32
cd /tmp/o && tar czf $FINAL/call2.tgz . ; cat stages.txt > $FINAL/log.txt
grep -hE "FAILED|ERROR|passed|failed" gpu_tests.txt | tail -40 >> $FINAL/log.txt
tail -16 bn_bandwidth.txt >> $FINAL/log.txt
grep -hE "^\| [a-z]" bench_resnet50_*.txt >> $FINAL/log.txt
