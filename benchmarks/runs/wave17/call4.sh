#!/usr/bin/env bash
# Call 4: every GPU test, named as it runs (two processes over the two halves of the files);
# VGG-16 bf16 and TF32, with and without --relu-bits, beside compiled PyTorch.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 520 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
FILES=$(grep -l "mark.gpu" tests/*.py)
A=$(echo $FILES | tr ' ' '\n' | head -14); B=$(echo $FILES | tr ' ' '\n' | tail -n +15)
L=$(cap 220)
timeout $L python3 -m pytest -m gpu -p no:cacheprovider -v -rfE --tb=short $A > $OUT/gpu_a.txt 2>&1 &
timeout $L python3 -m pytest -m gpu -p no:cacheprovider -v -rfE --tb=short $B > $OUT/gpu_b.txt 2>&1
wait; t tests
for run in vgg16:256:bf16 vgg16:256:tf32; do
  timeout $(cap 140) python3 scripts/bench_vs_pytorch.py --runs $run \
      --frameworks minidnn minidnn-relubits pytorch-cl-compiled --steps 10 --warmup 3 \
      --timeout 130 --out $OUT/bench_${run//:/_}.json > $OUT/bench_${run//:/_}.txt 2>&1; t $run
done
cd /tmp/o && tar czf $FINAL/call4.tgz . ; cat stages.txt > $FINAL/log.txt
grep -hE "FAILED|ERROR|passed|failed" gpu_a.txt gpu_b.txt | tail -40 >> $FINAL/log.txt
for f in bench_*.txt; do grep -E "^\| [a-z]" $f >> $FINAL/log.txt; done
