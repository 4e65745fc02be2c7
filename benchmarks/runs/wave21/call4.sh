#!/usr/bin/env bash
# Call 4: 2x2 max pools that tile their input issue a window's four loads before comparing
# (maxpool2d_forward_tiles2_vec; call 3: the pool applying the ReLU took 1.76 ms over VGG-16's
# five pools, the plain pool 1.30). The pools' GPU tests; VGG-16 in both precisions and
# GoogLeNet TF32 beside compiled PyTorch.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 500 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
bench() {   # bench NAME SECONDS RUN FRAMEWORKS...
    local name=$1 secs=$(cap $2) run=$3; shift 3
    timeout $secs python3 scripts/bench_vs_pytorch.py --runs $run --frameworks "$@" \
        --steps 10 --warmup 3 --profile --timeout $(( secs > 12 ? secs - 10 : 1 )) \
        --out $OUT/bench_$name.json > $OUT/bench_$name.txt 2>&1; t $name
}
timeout $(cap 80) python3 -m pytest -m gpu -p no:cacheprovider -v -rfE --tb=short \
    tests/test_pool_gpu.py tests/test_pool_relu_gpu.py > $OUT/gpu_tests.txt 2>&1; t tests
bench vgg16_bf16 110 vgg16:256:bf16 minidnn pytorch-cl-bf16-compiled
bench vgg16_tf32 120 vgg16:256:tf32 minidnn pytorch-cl-compiled
bench googlenet_tf32 200 googlenet:256:tf32 minidnn pytorch-cl-compiled
cd /tmp/o && tar czf $FINAL/call4.tgz . ; cat stages.txt > $FINAL/log.txt
grep -hE "FAILED|ERROR| passed| failed" gpu_tests.txt | tail -10 >> $FINAL/log.txt
grep -hE "^\| [a-z]" bench_*.txt >> $FINAL/log.txt
