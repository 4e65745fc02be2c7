#!/usr/bin/env bash
# Call B: whole steps against PyTorch's eager and compiled best, same call.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_CACHE=/tmp/cache
timeout 470 python3 scripts/bench_vs_pytorch.py --runs resnet50:256:bf16 vgg16:256:bf16 googlenet:256:tf32 --frameworks minidnn pytorch-cl pytorch-cl-compiled --steps 10 --warmup 3 --timeout 200 --out $OUT/bench.json > $OUT/bench.txt 2>&1
timeout 90 python3 scripts/fashion_mnist_vs_pytorch.py --data fashion-mnist:.gpu_data/fashion-mnist --models tiny_cnn --epochs 2 --no-compile --out $OUT/fm > $OUT/fm.txt 2>&1
cd /tmp/o && tar czf $FINAL/callB.tgz . ; cat /tmp/o/*.txt /tmp/o/*.md 2>/dev/null > $FINAL/log.txt
