#!/usr/bin/env bash
# Call 4: the GPU tests of the convolution's bias-and-ReLU epilogue (fprop_bias_relu), of the
# convolution kernels and the fused steps it touches, and of bf16 steps at their least
# budgets (the ring of replayed losses now made before the first capture); then whole steps
# beside PyTorch's channels_last compiled step: VGG-16, OverFeat and AlexNet in TF32 fused
# and with --no-fuse (VGG-16 also beside eager), VGG-16 and ResNet-50 in bf16.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
cap() { local left=$(( 535 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
timeout $(cap 130) python3 -m pytest -m gpu -p no:cacheprovider -rfE --tb=short \
    tests/test_conv_relu_gpu.py tests/test_budget_gpu.py tests/test_budget_conv_plans.py \
    tests/test_gpu_add_relu.py tests/test_gpu_batchnorm_fused.py \
    "tests/test_kernels_gpu.py::test_conv_tf32" "tests/test_kernels_gpu.py::test_direct_and_public_execute_agree" \
    "tests/test_kernels_gpu.py::test_convolution_falls_back_to_a_leaner_plan_when_the_workspace_does_not_fit" \
    > $OUT/gpu_tests.txt 2>&1; t tests
timeout $(cap 110) python3 scripts/bench_vs_pytorch.py --runs vgg16:256:tf32 \
    --frameworks minidnn minidnn-unfused pytorch-cl pytorch-cl-compiled --steps 10 --warmup 3 \
    --timeout 60 --out $OUT/bench_vgg_tf32.json > $OUT/bench_vgg_tf32.txt 2>&1; t bench_vgg_tf32
timeout $(cap 130) python3 scripts/bench_vs_pytorch.py --runs overfeat:256:tf32 alexnet:256:tf32 \
    --frameworks minidnn minidnn-unfused pytorch-cl-compiled --steps 10 --warmup 3 \
    --timeout 50 --out $OUT/bench_of_ax.json > $OUT/bench_of_ax.txt 2>&1; t bench_of_ax
timeout $(cap 170) python3 scripts/bench_vs_pytorch.py --runs vgg16:256:bf16 resnet50:256:bf16 \
    --frameworks minidnn pytorch-cl-compiled --steps 10 --warmup 3 \
    --timeout 100 --out $OUT/bench_bf16.json > $OUT/bench_bf16.txt 2>&1; t bench_bf16
cd /tmp/o && tar czf $FINAL/call4.tgz . ; cat stages.txt > $FINAL/log.txt
grep -E "passed|failed|FAILED|ERROR|Error" gpu_tests.txt | tail -14 >> $FINAL/log.txt
for f in bench_vgg_tf32 bench_of_ax bench_bf16; do grep "^|" $f.txt >> $FINAL/log.txt; done
