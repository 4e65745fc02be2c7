#!/usr/bin/env bash
# Call 2: a max pool that applies the ReLU before it in its forward (pool_relu_forward). The
# GPU tests of the pools and the fused steps; VGG-16 and OverFeat bf16 beside compiled
# PyTorch, profiled; VGG-16 bf16 again with that fusion off (fusion.py patched so that
# pool_relu_forward_pairs names none: the step of before, every other fusion on).
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 565 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
bench() {   # bench NAME SECONDS RUN FRAMEWORKS...
    local name=$1 secs=$(cap $2) run=$3; shift 3
    timeout $secs python3 scripts/bench_vs_pytorch.py --runs $run --frameworks "$@" \
        --steps 10 --warmup 3 --profile --timeout $(( secs > 12 ? secs - 10 : 1 )) \
        --out $OUT/bench_$name.json > $OUT/bench_$name.txt 2>&1; t $name
}
timeout $(cap 110) python3 -m pytest -m gpu -p no:cacheprovider -v -rfE --tb=short \
    tests/test_pool_relu_gpu.py tests/test_pool_gpu.py tests/test_fused_pool_relu.py \
    > $OUT/gpu_tests.txt 2>&1; t tests
bench vgg16_bf16 190 vgg16:256:bf16 minidnn pytorch-cl-bf16-compiled
cp minidnn/fusion.py /tmp/fusion.py
python3 - <<'PY'
p = "minidnn/fusion.py"
s = open(p).read()
old = "    return {relu: pool for relu, pool in pool_relu_pairs(plan).items()\n"
assert old in s
open(p, "w").write(s.replace(old, "    return {}\n    return {relu: pool for relu, pool in pool_relu_pairs(plan).items()\n"))
PY
bench vgg16_bf16_before 45 vgg16:256:bf16 minidnn
cp /tmp/fusion.py minidnn/fusion.py
bench overfeat_bf16 190 overfeat:256:bf16 minidnn pytorch-cl-bf16-compiled
cd /tmp/o && tar czf $FINAL/call2.tgz . ; cat stages.txt > $FINAL/log.txt
grep -hE "FAILED|ERROR| passed| failed" gpu_tests.txt | tail -30 >> $FINAL/log.txt
grep -hE "^\| [a-z]" bench_*.txt >> $FINAL/log.txt
