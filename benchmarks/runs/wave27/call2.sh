#!/usr/bin/env bash
# Call 2: the GPU tests of the products that add in place, the default math and the column
# totals; VGG-16 TF32 in 4 GiB beside PyTorch's accumulation of 4, 8 and 16 (eager and
# compiled), each framework's unconstrained step beside it; VGG-16 bf16 beside PyTorch's
# compiled step, and in 4 GiB beside its accumulation of 8 and 16.
set -u
. benchmarks/stages.sh call2 570
stage gpu_tests 100 python3 -m pytest -q -p no:cacheprovider tests/test_linear_add_gpu.py \
    tests/test_column_totals_gpu.py tests/test_pointwise_gpu.py tests/test_pool_relu_gpu.py \
    tests/test_micro_batches_gpu.py tests/test_deterministic_gpu.py
stage budget_vgg16_tf32 240 python3 scripts/bench_budget.py --model vgg16 --batch 256 \
    --math tf32 --caps none,4GiB --accumulate 4,8,16 --layouts channels_last --segments "" \
    --no-whole-batch --timeout 100 --time-limit 230 --out $OUT/budget_vgg16_tf32
stage bench_vgg16_bf16 100 python3 scripts/bench_vs_pytorch.py --runs vgg16:256:bf16 \
    --frameworks minidnn pytorch-cl-bf16-compiled --steps 10 --warmup 3 --timeout 90
stage budget_vgg16_bf16 200 python3 scripts/bench_budget.py --model vgg16 --batch 256 \
    --math bf16 --caps 4GiB --accumulate 8,16 --layouts channels_last --segments "" \
    --no-whole-batch --timeout 80 --time-limit 190 --out $OUT/budget_vgg16_bf16
