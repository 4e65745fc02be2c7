#!/usr/bin/env bash
# Call 3: layers timed replayed from a CUDA graph in the profile (planner/profile.py, _Clock):
# the clock's GPU tests, then the combination-matrix cells whose step the model missed by
# more than 10% in wave 21 (VGG-16 bf16 at 50% and its least budget, where a max pool applies
# the ReLU before it; AlexNet bf16 at 50%; OverFeat fp32 and ResNet-50 fp32 at their least).
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 560 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
matrix() {   # matrix NAME SECONDS MODELS PRECISIONS FRACTIONS
    local L=$(cap $2)
    timeout $L python3 scripts/matrix_gpu.py --out $OUT/$1 --in-process --models $3 \
        --precisions $4 --fractions $5 --time-limit $(( L > 12 ? L - 10 : 1 )) \
        > $OUT/$1.txt 2>&1; t $1
}
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_profile_gpu.py > $OUT/gpu_tests.txt 2>&1; t gpu_tests
matrix vgg16_bf16 130 vgg16 bf16 0.5,least
matrix alexnet_bf16 70 alexnet bf16 0.5
matrix overfeat_fp32 70 overfeat fp32 least
matrix resnet50_fp32 200 resnet50 fp32 least
cd /tmp/o && tar czf $FINAL/call3.tgz --exclude='*/runs' . ; cat stages.txt gpu_tests.txt > $FINAL/log.txt
for m in vgg16_bf16 alexnet_bf16 overfeat_fp32 resnet50_fp32; do
    cat $m/matrix.md >> $FINAL/log.txt 2>/dev/null || tail -15 $m.txt >> $FINAL/log.txt
done
