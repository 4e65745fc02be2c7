#!/usr/bin/env bash
# Call 5: the combination matrix's VGG-16 bf16 cells with the pools applying the ReLUs before
# them (this wave's fusion; call 1 ran before it), at 50% and the least budget.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
L=150; timeout $L python3 scripts/matrix_gpu.py --out $OUT/matrix --in-process \
    --models vgg16 --precisions bf16 --fractions 0.5,least --time-limit $((L - 10)) \
    > $OUT/matrix.txt 2>&1; t matrix
cd /tmp/o && tar czf $FINAL/call5.tgz --exclude='matrix/runs' . ; cat stages.txt > $FINAL/log.txt
cat matrix/matrix.md >> $FINAL/log.txt 2>/dev/null || tail -20 matrix.txt >> $FINAL/log.txt
