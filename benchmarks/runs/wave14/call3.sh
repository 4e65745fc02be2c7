#!/usr/bin/env bash
# Call 3: Fashion-MNIST ResNet-18 (40 epochs, random erasing) beside PyTorch eager (whole run)
# and compiled (2 epochs); the budget runs (25% refused, the least budget, a deterministic pair
# compared bit for bit) for 2 epochs; then the matrix's AlexNet rows with the time left.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 555 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
timeout $(cap 430) python3 scripts/fashion_mnist_vs_pytorch.py --data fashion-mnist:.gpu_data --models resnet18 \
    --compiled-epochs 2 --budget-fraction 0 --out $OUT/fm_torch > $OUT/fm_torch.txt 2>&1; t fm_torch
timeout $(cap 100) python3 scripts/fashion_mnist_vs_pytorch.py --data fashion-mnist:.gpu_data --models resnet18 \
    --no-torch --epochs 2 --budget-fraction 0.25 --budget-epochs 2 --out $OUT/fm_budget > $OUT/fm_budget.txt 2>&1; t fm_budget
L=$(cap 200); timeout $L python3 scripts/matrix_gpu.py --out $OUT/matrix --in-process \
    --models alexnet,overfeat --precisions bf16,fp32 --time-limit $(( L - 8 )) > $OUT/matrix.txt 2>&1; t matrix
cd /tmp/o && rm -rf matrix/*-probe.json fm_*/data && tar czf $FINAL/call3.tgz . ; cat stages.txt > $FINAL/log.txt
tail -40 fm_torch.txt >> $FINAL/log.txt; tail -30 fm_budget.txt >> $FINAL/log.txt; tail -25 matrix.txt >> $FINAL/log.txt
cp fm_torch/*.png $FINAL/ 2>/dev/null
