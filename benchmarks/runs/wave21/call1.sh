#!/usr/bin/env bash
# Call 1: the combination matrix on the GPU at this tree: ResNet-50 bf16 at 35% and its least
# budget since the add's kept gradient part went back to best fit; VGG-16 and GoogLeNet bf16,
# AlexNet and OverFeat in both precisions, ResNet-50 fp32, each at 50% and the least budget.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 565 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
matrix() {   # matrix NAME SECONDS MODELS PRECISIONS FRACTIONS
    local L=$(cap $2)
    timeout $L python3 scripts/matrix_gpu.py --out $OUT/$1 --in-process --models $3 \
        --precisions $4 --fractions $5 --time-limit $(( L > 12 ? L - 10 : 1 )) \
        > $OUT/$1.txt 2>&1; t $1
}
matrix resnet50_bf16 150 resnet50 bf16 0.35,least
matrix vgg_googlenet_bf16 165 vgg16,googlenet bf16 0.5,least
matrix alexnet_overfeat 125 alexnet,overfeat bf16,fp32 0.5,least
matrix resnet50_fp32 125 resnet50 fp32 0.5,least
cd /tmp/o && tar czf $FINAL/call1.tgz --exclude='*/runs' . ; cat stages.txt > $FINAL/log.txt
for m in resnet50_bf16 vgg_googlenet_bf16 alexnet_overfeat resnet50_fp32; do
    cat $m/matrix.md >> $FINAL/log.txt 2>/dev/null || tail -15 $m.txt >> $FINAL/log.txt
done
