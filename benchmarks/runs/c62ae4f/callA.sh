#!/usr/bin/env bash
# Call A: the GPU suite, the bf16 runs under budgets that failed mid-run, a GPU matrix slice,
# and a traced step for the docs' measured timeline.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
git rev-parse --short HEAD 2>/dev/null > $OUT/commit.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt 2>&1
( timeout 260 python3 -m pytest -q -m gpu -k "not two_gpus" tests -p no:cacheprovider 2>&1 | tail -40 ) > $OUT/gpu_tests.txt
echo "== gpu tests done $(date)" 
run() { echo "\$ $*"; timeout 100 python3 -m minidnn train --data synthetic --batch 256 --steps 6 --no-progress "$@" 2>&1 | tail -4; }
{
run --model resnet50 --precision bf16 --policy dyn --relu-bits --memory-budget 6GiB --report $OUT/r50_bf16_6.json
run --model vgg16 --precision bf16 --policy dyn --relu-bits --memory-budget 6GiB --report $OUT/vgg_bf16_6.json
run --model googlenet --precision bf16 --policy dyn --relu-bits --memory-budget 3GiB
run --model vgg16 --precision bf16 --policy dyn --relu-bits --memory-budget 3GiB
} > $OUT/bf16_budgets.txt 2>&1
echo "== bf16 done $(date)"
timeout 45 python3 -m minidnn train --model vgg16 --data synthetic --batch 64 --steps 4 --no-progress --policy all --memory-budget 8GiB --no-graphs --trace $OUT/trace_all.json --report $OUT/trace_all_run.json > $OUT/trace.txt 2>&1
timeout 60 python3 -m minidnn train --model vgg16 --data synthetic --batch 64 --steps 4 --no-progress --policy dyn --relu-bits --memory-budget 2.5GiB --no-graphs --trace $OUT/trace_split.json --report $OUT/trace_split_run.json >> $OUT/trace.txt 2>&1
echo "== trace done $(date)"
timeout 150 python3 scripts/matrix_gpu.py --out /tmp/matrix --models resnet50,googlenet --precisions bf16 --fractions 0.5,0.25,least --steps 4 --time-limit 140 > $OUT/matrix_log.txt 2>&1; cp /tmp/matrix/matrix.md /tmp/matrix/matrix.json $OUT/ 2>/dev/null
echo "== matrix done $(date)"
cd /tmp/o && tar czf $FINAL/callA.tgz . ; cat /tmp/o/*.txt /tmp/o/*.md 2>/dev/null > $FINAL/log.txt
