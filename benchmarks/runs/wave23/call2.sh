#!/usr/bin/env bash
# Call 2: held traces (--trace-held: the compute stream held while the host issues each call,
# so each span is the device's time) of the three combination-matrix cells the step model
# misses most at passes of a few images, each beside the model (scripts/model_vs_trace.py);
# the GPU tests of the held trace and of a traced step and evaluations beside captured steps
# under a budget (call 1's cells failed their traced 8th step: the graphs kept their blocks);
# ResNet-50 TF32 beside PyTorch's compiled step, both profiled kernel by kernel.
set -u
FINAL=$OUT; OUT=/tmp/o2; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 570 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
cell() {   # cell NAME SECONDS MODEL PRECISION BUDGET [flags]: the wave-22 matrix cell, traced held
    local n=$1 L=$(cap $2) m=$3 p=$4 b=$5; shift 5
    timeout $L python3 -m minidnn train --model $m --data synthetic --batch 256 --steps 8 \
        --device gpu --precision $p --policy dyn --relu-bits --memory-budget $b --eval-every 0 \
        --eval-batches 1 --no-progress --log-every 8 --report $OUT/$n.json \
        --trace $OUT/$n.trace.json --trace-held "$@" > $OUT/$n.txt 2>&1
    timeout $(cap 90) python3 scripts/model_vs_trace.py $OUT/$n.trace.json --report $OUT/$n.json \
        --top 25 --json $OUT/$n.compare.json > $OUT/$n.compare.md 2>&1
    t $n
}
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_budget_gpu.py \
    tests/test_runs_gpu.py -k "held or traced_step" > $OUT/gpu_tests.txt 2>&1; t gpu_tests
cell vgg16_bf16_50 100 vgg16 bf16 3693622016
cell overfeat_fp32_least 150 overfeat fp32 2244120412
cell resnet50_fp32_split_least 290 resnet50 fp32 389021696 --split-batch-statistics
L=$(cap 200); timeout $L python3 scripts/bench_vs_pytorch.py --runs resnet50:256:tf32 \
    --frameworks minidnn pytorch-cl-compiled --steps 10 --warmup 3 --profile --timeout 150 \
    --out $OUT/bench_resnet50_tf32.json > $OUT/bench_resnet50_tf32.txt 2>&1; t bench_resnet50_tf32
cd $OUT && for f in *.trace.json; do gzip -f $f; done
tar czf $FINAL/call2.tgz . ; cat stages.txt gpu_tests.txt *.compare.md bench_resnet50_tf32.txt > $FINAL/log.txt 2>&1
