#!/usr/bin/env bash
# Call 2: the GPU tests of the batch norm that applies the residual add and its ReLU
# (bn_add) and of the fused steps and budgets it touches; ResNet-50 in bf16 and TF32, fused
# and --no-fuse, beside PyTorch's channels_last compiled step; ResNet-50 bf16's matrix row.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 535 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
timeout $(cap 110) python3 -m pytest -m gpu -p no:cacheprovider -q -rfE --tb=short \
    tests/test_gpu_batchnorm_fused.py tests/test_gpu_add_relu.py tests/test_budget_gpu.py \
    > $OUT/gpu_tests.txt 2>&1; t tests
timeout $(cap 140) python3 scripts/bench_vs_pytorch.py --runs resnet50:256:bf16 \
    --frameworks minidnn minidnn-unfused pytorch-cl-compiled --steps 10 --warmup 3 \
    --timeout 100 --out $OUT/bench_bf16.json > $OUT/bench_bf16.txt 2>&1; t bench_bf16
timeout $(cap 140) python3 scripts/bench_vs_pytorch.py --runs resnet50:256:tf32 \
    --frameworks minidnn minidnn-unfused pytorch-cl-compiled --steps 10 --warmup 3 \
    --timeout 100 --out $OUT/bench_tf32.json > $OUT/bench_tf32.txt 2>&1; t bench_tf32
L=$(cap 150); timeout $L python3 scripts/matrix_gpu.py --out $OUT/matrix --in-process \
    --models resnet50 --precisions bf16 --fractions 0.5,least --time-limit $(( L - 10 )) \
    > $OUT/matrix.txt 2>&1; t matrix
cd /tmp/o && rm -f matrix/*-probe.json && tar czf $FINAL/call2.tgz . ; cat stages.txt > $FINAL/log.txt
grep -E "passed|failed|FAILED|ERROR|Error" gpu_tests.txt | tail -20 >> $FINAL/log.txt
for f in bench_bf16 bench_tf32; do grep -E "^\||ms/iter" $f.txt >> $FINAL/log.txt; done
tail -25 matrix.txt >> $FINAL/log.txt
