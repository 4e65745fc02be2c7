#!/usr/bin/env bash
# Call 3: every GPU test in one process; OverFeat TF32 fused and unfused beside compiled
# PyTorch, profiled; VGG-16 TF32 alone and in 4 GiB.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 540 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
timeout $(cap 280) python3 -m pytest -m gpu -p no:cacheprovider -q -rfE --tb=short tests \
    > $OUT/gpu_tests.txt 2>&1; t tests
timeout $(cap 100) python3 scripts/bench_vs_pytorch.py --runs overfeat:256:tf32 \
    --frameworks minidnn minidnn-unfused pytorch-cl-compiled --steps 10 --warmup 3 --profile \
    --timeout 90 --out $OUT/bench_overfeat_256_tf32.json > $OUT/bench_overfeat_256_tf32.txt 2>&1
t overfeat
timeout $(cap 150) python3 scripts/bench_budget.py --model vgg16 --batch 256 --math tf32 \
    --caps none,4GiB --only minidnn --timeout 70 --time-limit 145 --out $OUT/budget_vgg16_tf32 \
    > $OUT/budget_vgg16_tf32.txt 2>&1; t budget
cd /tmp/o && tar czf $FINAL/call3.tgz . ; cat stages.txt > $FINAL/log.txt
grep -hE "FAILED|ERROR|passed|failed" gpu_tests.txt | tail -40 >> $FINAL/log.txt
grep -E "^\| [a-z]" bench_overfeat_256_tf32.txt >> $FINAL/log.txt
tail -20 budget_vgg16_tf32.txt >> $FINAL/log.txt
