#!/usr/bin/env bash
# Call 4: the batch-norm GPU tests again after its three affine passes became one (a MODE
# template), and ResNet-50 bf16 fused and --no-fuse once more.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
timeout 150 python3 -m pytest -m gpu -p no:cacheprovider -q -rfE --tb=short \
    tests/test_gpu_batchnorm_fused.py tests/test_gpu_add_relu.py tests/test_batchnorm_sums.py \
    > $OUT/gpu_tests.txt 2>&1; t tests
timeout 60 python3 scripts/bench_vs_pytorch.py --runs resnet50:256:bf16 \
    --frameworks minidnn minidnn-unfused --steps 10 --warmup 3 \
    --timeout 40 --out $OUT/bench_bf16.json > $OUT/bench_bf16.txt 2>&1; t bench_bf16
cd /tmp/o && tar czf $FINAL/call4.tgz . ; cat stages.txt > $FINAL/log.txt
grep -E "passed|failed|FAILED|ERROR|Error" gpu_tests.txt | tail -20 >> $FINAL/log.txt
grep -E "ms/iter" bench_bf16.txt >> $FINAL/log.txt
