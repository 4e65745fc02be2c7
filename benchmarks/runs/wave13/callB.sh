#!/usr/bin/env bash
# Call B: the new kernels' GPU tests, Fashion-MNIST ResNet-18 beside PyTorch, and the fused
# step against PyTorch's compiled one (ResNet-50 bf16, GoogLeNet TF32). Stages in order of
# need, each under its own time limit.
set -u
FINAL=$OUT; OUT=/tmp/o; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
START=$(date +%s); t() { echo "== $1 $(( $(date +%s)-START )) s" | tee -a $OUT/stages.txt; }
# cap N: N seconds, or what is left of the call's 565 s if less (the results are packed after)
cap() { local left=$(( 565 - ($(date +%s)-START) )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
git rev-parse --short HEAD > $OUT/commit.txt 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt 2>&1
GPU_TESTS="tests/test_gpu_batchnorm_fused.py tests/test_gpu_add_relu.py tests/test_gpu_concat_lrn.py tests/test_lr_graph.py tests/test_budget_gpu.py tests/test_budget_conv_plans.py tests/test_budget_draws.py tests/test_sgd_update_gpu.py tests/test_pool_gpu.py tests/test_bf16_kernels_gpu.py tests/test_pointwise_gpu.py"
( timeout $(cap 90) python3 -m pytest -q -m gpu -p no:cacheprovider $GPU_TESTS 2>&1 | tail -60 ) > $OUT/gpu_tests.txt; t tests
( timeout $(cap 35) python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_layers_gpu.py tests/test_kernels_gpu.py -k "linear or batchnorm or batch_norm or lrn or concat or add or relu" 2>&1 | tail -30 ) > $OUT/gpu_tests2.txt; t tests2
timeout $(cap 220) python3 scripts/fashion_mnist_vs_pytorch.py --data fashion-mnist:.gpu_data --models resnet18 \
    --budget-fraction 0.25 --budget-epochs 2 --eager-epochs 2 --out $OUT/fm > $OUT/fm.txt 2>&1; t fm
timeout $(cap 100) python3 scripts/bench_vs_pytorch.py --runs resnet50:256:bf16 --frameworks minidnn pytorch-cl-bf16-compiled --profile --out $OUT/bench_r50.json > $OUT/bench_r50.txt 2>&1; t r50
timeout $(cap 130) python3 scripts/bench_vs_pytorch.py --runs googlenet:256:tf32 --frameworks minidnn pytorch-cl-compiled --out $OUT/bench_goog.json > $OUT/bench_goog.txt 2>&1; t goog
run() { echo "\$ minidnn train $*"; timeout $(cap 45) python3 -m minidnn train --data synthetic --batch 256 --steps 6 --no-progress "$@" 2>&1 | tail -3; }
{ run --model googlenet --precision bf16 --policy dyn --relu-bits --memory-budget 3GiB
  run --model vgg16 --precision bf16 --policy dyn --relu-bits --memory-budget 3GiB; } > $OUT/bf16_budgets.txt 2>&1; t budgets
cd /tmp/o && tar czf $FINAL/callB.tgz . ; cat stages.txt gpu_tests.txt gpu_tests2.txt bf16_budgets.txt > $FINAL/log.txt; tail -n 30 fm.txt bench_r50.txt bench_goog.txt >> $FINAL/log.txt; cp fm/*.png $FINAL/ 2>/dev/null
