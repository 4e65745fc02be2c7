#!/usr/bin/env bash
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s)
git rev-parse --short HEAD > $OUT/commit.txt 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt 2>&1
python3 -c "import torch; print(torch.__version__)" >> $OUT/gpu.txt 2>&1
timeout 100 python3 scripts/layer_times.py --model resnet50 --batch 256 --precision bf16 --layout nhwc --top 40 --json $OUT/lt_r50_bf16.json > $OUT/lt_r50_bf16.txt 2>&1
echo "== r50 $(( $(date +%s)-START ))"
timeout 80 python3 scripts/layer_times.py --model vgg16 --batch 256 --precision bf16 --layout nhwc --top 25 --json $OUT/lt_vgg_bf16.json > $OUT/lt_vgg_bf16.txt 2>&1
echo "== vgg $(( $(date +%s)-START ))"
timeout 80 python3 scripts/layer_times.py --model googlenet --batch 256 --layout nhwc --top 30 --json $OUT/lt_goog.json > $OUT/lt_goog.txt 2>&1
echo "== goog $(( $(date +%s)-START ))"
timeout 150 python3 scripts/bench_vs_pytorch.py --runs resnet50:256:bf16 --frameworks minidnn pytorch-cl-bf16-compiled --profile --out $OUT/prof.json > $OUT/prof.txt 2>&1
echo "== prof $(( $(date +%s)-START ))"
LEFT=$(( 560 - ($(date +%s)-START) ))
timeout $LEFT python3 scripts/fashion_mnist_vs_pytorch.py --data fashion-mnist:.gpu_data --models resnet18 --out $OUT/fm > $OUT/fm.txt 2>&1
echo "== fm $(( $(date +%s)-START ))"
cd /tmp/o && tar czf $FINAL/callA.tgz . ; tail -n 60 /tmp/o/*.txt > $FINAL/log.txt
