#!/usr/bin/env bash
# Call 4: the batch-norm passes' bandwidth timed from CUDA graphs (bn_bandwidth.py's new
# default); the combination matrix for ResNet-50 bf16 under budgets (the residual add's
# gradient sum and the kept part under a budget, on the GPU).
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 300 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
timeout $(cap 70) python3 scripts/bn_bandwidth.py --repeats 10 > $OUT/bn_bandwidth.txt 2>&1
t bn_bandwidth
L=$(cap 220); timeout $L python3 scripts/matrix_gpu.py --out $OUT/matrix --in-process \
    --models resnet50 --precisions bf16 --fractions 0.5,0.35,least --time-limit $((L - 10)) \
    > $OUT/matrix.txt 2>&1; t matrix
cp $OUT/matrix/matrix.md $OUT/matrix.md 2>/dev/null
cd /tmp/o && tar czf $FINAL/call4.tgz --exclude='matrix/runs' . ; cat stages.txt > $FINAL/log.txt
tail -3 bn_bandwidth.txt >> $FINAL/log.txt
cat matrix.md >> $FINAL/log.txt 2>/dev/null || tail -20 matrix.txt >> $FINAL/log.txt
