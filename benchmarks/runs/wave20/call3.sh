#!/usr/bin/env bash
# Call 3: bf16 rounding by the hardware's conversion and the batch norm's ReLU mask as one
# comparison. The GPU tests of the kernels they touch; ResNet-50 bf16 beside compiled
# PyTorch, profiled, and the same step with the kernels of before (.whl/cuda_pointwise_before.py,
# .whl/cuda_batchnorm_before20.py: git show 5f78442:minidnn/kernels/...); VGG-16 bf16 beside
# compiled PyTorch.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 570 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
timeout $(cap 130) python3 -m pytest -m gpu -p no:cacheprovider -v -rfE --tb=short \
    tests/test_precision.py tests/test_bf16_kernels_gpu.py tests/test_gpu_batchnorm_fused.py \
    tests/test_gpu_add_relu.py tests/test_pointwise_gpu.py > $OUT/gpu_tests.txt 2>&1; t tests
timeout $(cap 170) python3 scripts/bench_vs_pytorch.py --runs resnet50:256:bf16 \
    --frameworks minidnn pytorch-cl-bf16-compiled --steps 10 --warmup 3 --profile \
    --timeout 160 --out $OUT/bench_resnet50_bf16.json > $OUT/bench_resnet50_bf16.txt 2>&1
t resnet50_bf16
mkdir -p /tmp/now && cp minidnn/kernels/cuda_pointwise.py minidnn/kernels/cuda_batchnorm.py /tmp/now/
cp .whl/cuda_pointwise_before.py minidnn/kernels/cuda_pointwise.py
cp .whl/cuda_batchnorm_before20.py minidnn/kernels/cuda_batchnorm.py
timeout $(cap 60) python3 scripts/bench_vs_pytorch.py --runs resnet50:256:bf16 \
    --frameworks minidnn --steps 10 --warmup 3 --profile --timeout 55 \
    --out $OUT/bench_resnet50_bf16_before.json > $OUT/bench_resnet50_bf16_before.txt 2>&1
t resnet50_bf16_before
cp /tmp/now/cuda_pointwise.py /tmp/now/cuda_batchnorm.py minidnn/kernels/
timeout $(cap 200) python3 scripts/bench_vs_pytorch.py --runs vgg16:256:bf16 \
    --frameworks minidnn pytorch-cl-bf16-compiled --steps 10 --warmup 3 \
    --timeout 190 --out $OUT/bench_vgg16_bf16.json > $OUT/bench_vgg16_bf16.txt 2>&1
t vgg16_bf16
cd /tmp/o && tar czf $FINAL/call3.tgz . ; cat stages.txt > $FINAL/log.txt
grep -hE "FAILED|ERROR| passed| failed" gpu_tests.txt | tail -30 >> $FINAL/log.txt
grep -hE "^\| [a-z]" bench_*.txt >> $FINAL/log.txt
