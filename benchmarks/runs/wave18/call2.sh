#!/usr/bin/env bash
# Call 2: max pools that apply the masks of the ReLUs before them (pool_relu): the pooling
# and fusion GPU tests and the whole-run tests; VGG-16 bf16 and TF32 and OverFeat TF32
# beside compiled PyTorch.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 535 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
timeout $(cap 200) python3 -m pytest -m gpu -p no:cacheprovider -v -rfE --tb=short \
    tests/test_pool_relu_gpu.py tests/test_pool_gpu.py tests/test_gpu_add_relu.py \
    tests/test_gpu_batchnorm_fused.py tests/test_runs_gpu.py > $OUT/gpu_tests.txt 2>&1; t tests
for run in vgg16:256:bf16 vgg16:256:tf32 overfeat:256:tf32; do
  timeout $(cap 120) python3 scripts/bench_vs_pytorch.py --runs $run \
      --frameworks minidnn pytorch-cl-compiled --steps 10 --warmup 3 \
      --timeout 110 --out $OUT/bench_${run//:/_}.json > $OUT/bench_${run//:/_}.txt 2>&1; t $run
done
cd /tmp/o && tar czf $FINAL/call2.tgz . ; cat stages.txt > $FINAL/log.txt
grep -hE "FAILED|ERROR|passed|failed" gpu_tests.txt | tail -40 >> $FINAL/log.txt
for f in bench_*.txt; do grep -E "^\| [a-z]" $f >> $FINAL/log.txt; done
