#!/usr/bin/env bash
# Call 1: what three input channels cost a first convolution (minidnn's layer times with the
# input given 3, 4 or 8 channels, and PyTorch's on the same shapes), then ResNet-50 TF32 and
# GoogLeNet bf16 beside PyTorch eager and compiled (channels_last).
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 535 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
for prec in bf16 fp32; do for net in resnet50 vgg16 googlenet alexnet; do for c in 3 4 8; do
  echo "minidnn $prec $net C=$c: $(PROBE_NET=$net PROBE_C=$c timeout $(cap 40) python3 \
    scripts/layer_times.py --model benchmarks/runs/wave16/first_conv.py --batch 256 \
    --layout nhwc --precision $prec --top 1 2>&1 | grep -E '^  conv1 ')" >> $OUT/probe.txt
done; done; done; t probe_minidnn
timeout $(cap 90) python3 benchmarks/runs/wave16/probe_torch_conv1.py >> $OUT/probe.txt 2>&1; t probe_torch
timeout $(cap 200) python3 scripts/bench_vs_pytorch.py --runs resnet50:256:tf32 googlenet:256:bf16 \
    --frameworks minidnn pytorch-cl pytorch-cl-compiled --steps 10 --warmup 3 \
    --timeout 100 --out $OUT/bench.json > $OUT/bench.txt 2>&1; t bench
cd /tmp/o && tar czf $FINAL/call1.tgz . ; cat stages.txt probe.txt > $FINAL/log.txt
grep "^|" bench.txt >> $FINAL/log.txt; tail -5 bench.txt >> $FINAL/log.txt
