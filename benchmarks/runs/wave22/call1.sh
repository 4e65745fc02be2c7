#!/usr/bin/env bash
# Call 1: the step model against traced steps of the four combination-matrix cells whose step
# it missed by more than 10% (wave 21, call 1), each run twice (replayed, then traced) and
# planned again from its report on the same GPU (scripts/model_vs_trace.py); ResNet-50's
# whole-batch statistics under 8 GiB (TF32, bf16) beside its own unconstrained step.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 560 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
cell() {   # cell NAME SECONDS MODEL PRECISION BUDGET [EXTRA...]
    local name=$1 L=$(cap $2) model=$3 prec=$4 budget=$5; shift 5
    local common="--model $model --batch 256 --precision $prec --policy dyn --relu-bits --memory-budget $budget $*"
    timeout $L bash -c "python3 -m minidnn train $common --data synthetic --steps 8 --eval-every 0 \
        --no-progress --log-every 8 --report $OUT/$name.json > $OUT/$name.txt 2>&1 &&
      python3 -m minidnn train $common --data synthetic --steps 3 --eval-every 0 --no-progress \
        --log-every 3 --trace $OUT/$name.trace.json --report $OUT/$name.traced.json >> $OUT/$name.txt 2>&1 &&
      python3 scripts/model_vs_trace.py $OUT/$name.trace.json --report $OUT/$name.json \
        --top 20 --json $OUT/$name.compare.json > $OUT/$name.compare.md 2>&1"
    t $name
}
cell vgg16_bf16_50 90 vgg16 bf16 3693622016
cell alexnet_bf16_50 70 alexnet bf16 1028994944
cell overfeat_fp32_least 70 overfeat fp32 2244120412
cell resnet50_fp32_split_least 150 resnet50 fp32 389021696 --split-batch-statistics
L=$(cap 200); timeout $L python3 scripts/bench_budget.py --model resnet50 --batch 256 --math tf32 \
    --caps none,8GiB --only minidnn --steps 6 --warmup 3 --time-limit $(( L - 10 )) \
    --out $OUT/budget_r50_tf32 > $OUT/budget_r50_tf32.txt 2>&1; t budget_r50_tf32
L=$(cap 150); timeout $L python3 scripts/bench_budget.py --model resnet50 --batch 256 --math bf16 \
    --caps none,8GiB,6GiB --only minidnn --steps 6 --warmup 3 --time-limit $(( L - 10 )) \
    --out $OUT/budget_r50_bf16 > $OUT/budget_r50_bf16.txt 2>&1; t budget_r50_bf16
cd /tmp/o && tar czf $FINAL/call1.tgz . ; cat stages.txt > $FINAL/log.txt
for f in *.compare.md budget_*/bench_budget.md; do echo "### $f"; cat $f; done >> $FINAL/log.txt 2>/dev/null
