#!/usr/bin/env bash
# Call 3: the add that takes over its gradient sum, and batch-norm sums that load a run of
# rows first: ResNet-50 bf16 fused, unfused and compiled PyTorch, profiled; the same step
# with the batch-norm kernels of a985a82 (.whl/cuda_batchnorm_before.py); ResNet-50 TF32;
# then every GPU test, verbose, in the time left.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 545 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
timeout $(cap 150) python3 scripts/bench_vs_pytorch.py --runs resnet50:256:bf16 \
    --frameworks minidnn minidnn-unfused pytorch-cl-bf16-compiled --steps 10 --warmup 3 \
    --profile --timeout 120 --out $OUT/bench_resnet50_bf16.json \
    > $OUT/bench_resnet50_bf16.txt 2>&1; t resnet50_bf16
cp minidnn/kernels/cuda_batchnorm.py /tmp/bn_new.py
cp .whl/cuda_batchnorm_before.py minidnn/kernels/cuda_batchnorm.py
timeout $(cap 60) python3 scripts/bench_vs_pytorch.py --runs resnet50:256:bf16 \
    --frameworks minidnn --steps 10 --warmup 3 --profile --timeout 55 \
    --out $OUT/bench_resnet50_bf16_bn_before.json > $OUT/bench_resnet50_bf16_bn_before.txt 2>&1
cp /tmp/bn_new.py minidnn/kernels/cuda_batchnorm.py; t bn_before
timeout $(cap 110) python3 scripts/bench_vs_pytorch.py --runs resnet50:256:tf32 \
    --frameworks minidnn pytorch-cl-compiled --steps 10 --warmup 3 \
    --timeout 100 --out $OUT/bench_resnet50_tf32.json > $OUT/bench_resnet50_tf32.txt 2>&1
t resnet50_tf32
timeout $(cap 300) python3 -m pytest -m gpu -p no:cacheprovider -v -rfE --tb=short tests \
    > $OUT/gpu_tests.txt 2>&1; t tests
cd /tmp/o && tar czf $FINAL/call3.tgz . ; cat stages.txt > $FINAL/log.txt
grep -hE "^\| [a-z]" bench_resnet50_*.txt >> $FINAL/log.txt
grep -hE "FAILED|ERROR| passed| failed" gpu_tests.txt | tail -40 >> $FINAL/log.txt
grep -c PASSED gpu_tests.txt >> $FINAL/log.txt
