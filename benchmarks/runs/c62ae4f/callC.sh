#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_pool_gpu.py tests/test_layers_gpu.py 2>&1 | tail -3
timeout 120 python3 scripts/fashion_mnist_vs_pytorch.py --data fashion-mnist:.gpu_data/fashion-mnist --models tiny_cnn --epochs 1 --train-limit 12000 --out $OUT/fm 2>&1 | grep -v "^warm" | tail -8
