#!/usr/bin/env bash
# An early check of new kernels: their GPU tests and bandwidth scripts.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
cd .gpu_early
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
( timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_batchnorm_fused.py tests/test_gpu_concat_lrn.py tests/test_lr_graph.py tests/test_sgd_update_gpu.py tests/test_pool_gpu.py tests/test_bf16_kernels_gpu.py tests/test_kernels_gpu.py tests/test_layers_gpu.py -k "batchnorm or batch_norm or concat or lrn or pool or sgd or lr or linear or fused or bn" 2>&1 | tail -40 ) > $OUT/tests.txt
timeout 40 python3 scripts/bn_bandwidth.py > $OUT/bn_bw.txt 2>&1
timeout 40 python3 scripts/concat_lrn_bandwidth.py --precision fp32 > $OUT/cl_bw.txt 2>&1; timeout 40 python3 scripts/concat_lrn_bandwidth.py --precision bf16 >> $OUT/cl_bw.txt 2>&1
cat $OUT/tests.txt $OUT/bn_bw.txt $OUT/cl_bw.txt > $FINAL/log.txt
