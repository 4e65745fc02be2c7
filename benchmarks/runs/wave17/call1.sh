#!/usr/bin/env bash
# Call 1: what cuDNN's fused convolution + batch-norm graphs cost on ResNet-50's convolutions;
# where VGG-16 bf16's step goes, minidnn's and compiled PyTorch's, side by side.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 530 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
timeout $(cap 170) python3 benchmarks/runs/wave17/conv_bn_probe.py --time-limit 140 \
    > $OUT/probe.txt 2>&1; t probe
timeout $(cap 200) python3 scripts/bench_vs_pytorch.py --runs vgg16:256:bf16 \
    --frameworks minidnn pytorch-cl-compiled --steps 10 --warmup 3 --profile \
    --timeout 180 --out $OUT/bench_vgg.json > $OUT/bench_vgg.txt 2>&1; t bench_vgg
timeout $(cap 150) python3 scripts/layer_times.py --model vgg16 --batch 256 --precision bf16 \
    --layout nhwc --top 40 --json $OUT/vgg_layers.json > $OUT/vgg_layers.txt 2>&1; t layers
cd /tmp/o && tar czf $FINAL/call1.tgz . ; cat stages.txt > $FINAL/log.txt
cat probe.txt >> $FINAL/log.txt; grep -v "^minidnn: profiling" bench_vgg.txt | tail -80 >> $FINAL/log.txt
head -60 vgg_layers.txt >> $FINAL/log.txt
