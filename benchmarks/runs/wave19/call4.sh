#!/usr/bin/env bash
# Call 4 (call 3 was taken back before it ended, with nothing written): the GPU tests of the
# add's gradient sum, the batch-norm kernels and the SGD update; ResNet-50 bf16 fused,
# unfused and compiled PyTorch, profiled; the same step with the batch-norm kernels of
# a985a82 (.whl/cuda_batchnorm_before.py).
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 275 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
timeout $(cap 80) python3 -m pytest -m gpu -p no:cacheprovider -v -rfE --tb=short \
    tests/test_gpu_add_relu.py tests/test_gpu_batchnorm_fused.py tests/test_sgd_update_gpu.py \
    > $OUT/gpu_tests.txt 2>&1; t tests
timeout $(cap 130) python3 scripts/bench_vs_pytorch.py --runs resnet50:256:bf16 \
    --frameworks minidnn minidnn-unfused pytorch-cl-bf16-compiled --steps 10 --warmup 3 \
    --profile --timeout 110 --out $OUT/bench_resnet50_bf16.json \
    > $OUT/bench_resnet50_bf16.txt 2>&1; t resnet50_bf16
cp .whl/cuda_batchnorm_before.py minidnn/kernels/cuda_batchnorm.py
timeout $(cap 50) python3 scripts/bench_vs_pytorch.py --runs resnet50:256:bf16 \
    --frameworks minidnn --steps 10 --warmup 3 --profile --timeout 45 \
    --out $OUT/bench_resnet50_bf16_bn_before.json > $OUT/bench_resnet50_bf16_bn_before.txt 2>&1
t bn_before
cd /tmp/o && tar czf $FINAL/call4.tgz . ; cat stages.txt > $FINAL/log.txt
grep -hE "^\| [a-z]" bench_resnet50_*.txt >> $FINAL/log.txt
grep -hE "FAILED|ERROR| passed| failed" gpu_tests.txt | tail -30 >> $FINAL/log.txt
