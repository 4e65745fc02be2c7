#!/usr/bin/env bash
# Call 6: after the memory manager worked out each node's forward reads once, the GPU's fused
# batch-norm and add tests and ResNet-50 bf16 fused and --no-fuse.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
timeout 90 python3 -m pytest -m gpu -p no:cacheprovider -q -rfE --tb=short \
    tests/test_gpu_batchnorm_fused.py tests/test_gpu_add_relu.py > $OUT/gpu_tests.txt 2>&1
timeout 50 python3 scripts/bench_vs_pytorch.py --runs resnet50:256:bf16 \
    --frameworks minidnn minidnn-unfused --steps 10 --warmup 3 \
    --timeout 40 --out $OUT/bench_bf16.json > $OUT/bench_bf16.txt 2>&1
cd /tmp/o && tar czf $FINAL/call6.tgz . ; tail -1 gpu_tests.txt > $FINAL/log.txt
grep -E "ms/iter" bench_bf16.txt >> $FINAL/log.txt
