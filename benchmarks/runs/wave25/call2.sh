#!/usr/bin/env bash
# Call 2: a residual add that takes the sums of the batch norm before it (bn_sums): its GPU
# tests (the kernel against the add's pass then the batch norm's, fused steps against
# --no-fuse), the two ways timed on ResNet-50's block outputs, and ResNet-50 in TF32 and
# bf16 beside PyTorch's compiled step (TF32 profiled, kernels by class); VGG-16 TF32 alone and
# in 4 GiB, planned from profiles that lay out the weights as the run does.
set -u
. benchmarks/stages.sh call2 575
stage gpu_tests 100 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_batchnorm_fused.py \
    tests/test_gpu_add_relu.py -k "handed or sums or batch_norms or fused_gpu_step"
stage handed_sums_clock 60 python3 benchmarks/runs/wave25/handed_sums_clock.py
stage bench_resnet50_tf32 150 python3 scripts/bench_vs_pytorch.py --runs resnet50:256:tf32 \
    --frameworks minidnn pytorch-cl-compiled --steps 10 --warmup 3 --profile --timeout 130 \
    --out $OUT/bench_resnet50_tf32.json
stage bench_resnet50_bf16 110 python3 scripts/bench_vs_pytorch.py --runs resnet50:256:bf16 \
    --frameworks minidnn pytorch-cl-bf16-compiled --steps 10 --warmup 3 --timeout 100 \
    --out $OUT/bench_resnet50_bf16.json
stage budget_vgg16_tf32 110 python3 scripts/bench_budget.py --model vgg16 --batch 256 \
    --math tf32 --caps none,4GiB --only minidnn --timeout 70 --time-limit 100 \
    --out $OUT/budget_vgg16_tf32
