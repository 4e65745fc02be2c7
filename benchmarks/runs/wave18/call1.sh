#!/usr/bin/env bash
# Call 1: the GPU tests of whole runs, alone in their process (host batches entering
# channels-last maps, the deterministic VGG-16 under every policy); GoogLeNet bf16 beside
# compiled PyTorch with room to compile; VGG-16 TF32 alone and at a 4 GiB cap.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 530 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > $OUT/gpu.txt
timeout $(cap 170) python3 -m pytest -m gpu -p no:cacheprovider -v -rfE --tb=short \
    tests/test_runs_gpu.py > $OUT/gpu_runs.txt 2>&1; t tests
timeout $(cap 120) python3 scripts/bench_budget.py --model vgg16 --batch 256 --math tf32 \
    --caps none,4 --only minidnn --time-limit 110 --out $OUT/budget_vgg16_tf32.json \
    > $OUT/budget_vgg16_tf32.txt 2>&1; t budget
timeout $(cap 330) python3 scripts/bench_vs_pytorch.py --runs googlenet:256:bf16 \
    --frameworks minidnn pytorch-cl-compiled --steps 10 --warmup 3 --timeout 320 \
    --out $OUT/bench_googlenet_bf16.json > $OUT/bench_googlenet_bf16.txt 2>&1; t googlenet
cd /tmp/o && tar czf $FINAL/call1.tgz . ; cat stages.txt > $FINAL/log.txt
grep -hE "FAILED|ERROR|passed|failed" gpu_runs.txt | tail -30 >> $FINAL/log.txt
tail -25 budget_vgg16_tf32.txt >> $FINAL/log.txt
grep -E "^\| [a-z]" bench_googlenet_bf16.txt >> $FINAL/log.txt
