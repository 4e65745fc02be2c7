#!/usr/bin/env bash
# Call 2: VGG-16 TF32 in 4 GiB beside its unconstrained step and PyTorch's accumulation; the
# combination matrix's AlexNet fp32 least cell traced (the step the model priced 10% fast in
# call 1); the matrix's cells of ResNet-50 (whole-batch and split statistics) and GoogLeNet.
set -u
. benchmarks/stages.sh call2 590
stage budget_vgg16_tf32 150 python3 scripts/bench_budget.py --model vgg16 --batch 256 \
    --math tf32 --caps none,4GiB --accumulate 8 --layouts channels_last --segments "" \
    --no-whole-batch --timeout 90 --time-limit 145 --out $OUT/budget_vgg16_tf32
stage matrix_alexnet_trace 60 python3 scripts/matrix_gpu.py --out $OUT/matrix_alexnet \
    --in-process --models alexnet --precisions fp32 --fractions least --trace --time-limit 55
stage matrix_resnet50 140 python3 scripts/matrix_gpu.py --out $OUT/matrix_resnet50 \
    --in-process --models resnet50 --precisions fp32,bf16 --statistics whole \
    --fractions 0.75,0.35,0.25 --time-limit 135
stage matrix_googlenet 120 python3 scripts/matrix_gpu.py --out $OUT/matrix_googlenet \
    --in-process --models googlenet --precisions fp32,bf16 --fractions 0.75,0.5,0.35,0.25 \
    --time-limit 115
stage matrix_resnet50_split 110 python3 scripts/matrix_gpu.py --out $OUT/matrix_resnet50_split \
    --in-process --models resnet50 --precisions fp32,bf16 --statistics split \
    --fractions 0.75,0.5,0.35,0.25 --time-limit 105
