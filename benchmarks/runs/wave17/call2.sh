#!/usr/bin/env bash
# Call 2: the column passes (a convolution's bias gradient, alone or in the ReLU's backward)
# with 16-byte vectors: the GPU tests, then VGG-16 (bf16, TF32) and OverFeat bf16 beside
# compiled PyTorch.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 540 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
timeout $(cap 120) python3 -m pytest -q -p no:cacheprovider -x tests/test_pointwise_gpu.py \
    > $OUT/gpu_tests.txt 2>&1; t tests
for run in vgg16:256:bf16 vgg16:256:tf32 overfeat:256:bf16; do
  timeout $(cap 140) python3 scripts/bench_vs_pytorch.py --runs $run \
      --frameworks minidnn pytorch-cl-compiled --steps 10 --warmup 3 --profile \
      --timeout 130 --out $OUT/bench_${run//:/_}.json > $OUT/bench_${run//:/_}.txt 2>&1; t $run
done
cd /tmp/o && tar czf $FINAL/call2.tgz . ; cat stages.txt > $FINAL/log.txt
tail -5 gpu_tests.txt >> $FINAL/log.txt
for f in bench_*.txt; do grep -v "^minidnn: profiling" $f | tail -12 >> $FINAL/log.txt; done
