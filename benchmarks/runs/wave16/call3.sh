#!/usr/bin/env bash
# Call 3: GoogLeNet bf16 beside PyTorch's channels_last compiled step; ResNet-50 TF32 under a
# 6 GiB cap (split statistics) beside PyTorch's compiled accumulation; ResNet-50 fp32's
# matrix row.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 520 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
timeout $(cap 150) python3 scripts/bench_vs_pytorch.py --runs googlenet:256:bf16 \
    --frameworks minidnn pytorch-cl-compiled --steps 10 --warmup 3 \
    --timeout 130 --out $OUT/bench_goog.json > $OUT/bench_goog.txt 2>&1; t bench_goog
L=$(cap 220); timeout $L python3 scripts/bench_budget.py --model resnet50 --caps 6GiB \
    --math tf32 --accumulate 2,4 --segments "" --layouts channels_last --split-batch-statistics \
    --time-limit $(( L - 10 )) --timeout 120 --out $OUT/budget > $OUT/budget.txt 2>&1; t budget
L=$(cap 150); timeout $L python3 scripts/matrix_gpu.py --out $OUT/matrix --in-process \
    --models resnet50 --precisions fp32 --fractions 0.5,least --time-limit $(( L - 10 )) \
    > $OUT/matrix.txt 2>&1; t matrix
cd /tmp/o && rm -f matrix/*-probe.json && tar czf $FINAL/call3.tgz . ; cat stages.txt > $FINAL/log.txt
grep -E "^\||ms/iter" bench_goog.txt >> $FINAL/log.txt; tail -30 budget.txt >> $FINAL/log.txt
tail -16 matrix.txt >> $FINAL/log.txt
