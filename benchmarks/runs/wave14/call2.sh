#!/usr/bin/env bash
# Call 2: the matrix rows left (VGG-16 fp32, GoogLeNet, AlexNet, OverFeat), the cells whose
# peak was off rerun without CUDA graphs, and the arena's log of the small bf16 networks that
# run out at their least budget.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 555 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
timeout $(cap 60) python3 benchmarks/runs/wave14/arena_log.py $OUT/arena > $OUT/arena.txt 2>&1; t arena
L=$(cap 110); timeout $L python3 scripts/matrix_gpu.py --out $OUT/nographs --in-process --no-graphs \
    --models vgg16,resnet50 --precisions bf16,fp32 --fractions 0.5,0.35,0.25 --time-limit $(( L - 10 )) > $OUT/nographs.txt 2>&1; t nographs
L=$(cap 400); timeout $L python3 scripts/matrix_gpu.py --out $OUT/matrix --in-process \
    --models googlenet,alexnet,overfeat,vgg16 --precisions bf16,fp32 --time-limit $(( L - 15 )) > $OUT/matrix.txt 2>&1; t matrix
cp -r /tmp/cache/profiles $OUT/profiles 2>/dev/null
cd /tmp/o && rm -rf matrix/*-probe.json nographs/*-probe.json arena/cache-* && tar czf $FINAL/call2.tgz . ; cat stages.txt arena.txt > $FINAL/log.txt
tail -30 nographs.txt >> $FINAL/log.txt; tail -60 matrix.txt >> $FINAL/log.txt
