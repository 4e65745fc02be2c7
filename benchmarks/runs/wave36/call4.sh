#!/usr/bin/env bash
# Call 4: the profile times the pass adding a convolution's bias apart (LayerCost.bias_s) and
# the step model leaves it out of each convolution whose ReLU adds the bias (call 3: VGG-16
# fp32's forward convolutions predicted 14.30 ms a pass, traced 10.82). The GPU test, then
# the matrix's cells nearest either end of the step target, VGG-16 fp32 at 75% traced again.
set -u
. benchmarks/stages.sh call4 560
stage gpu_tests 90 python3 -m pytest -q -p no:cacheprovider tests/test_profile_gpu.py
stage trace_vgg16_fp32 120 python3 scripts/matrix_gpu.py --out $OUT/trace_vgg16_fp32 \
    --in-process --models vgg16 --precisions fp32 --fractions 0.75,0.25 --trace \
    --time-limit 115
stage matrix_vgg16_bf16 80 python3 scripts/matrix_gpu.py --out $OUT/matrix_vgg16_bf16 \
    --in-process --models vgg16 --precisions bf16 --fractions least --time-limit 75
stage matrix_alexnet 80 python3 scripts/matrix_gpu.py --out $OUT/matrix_alexnet \
    --in-process --models alexnet --precisions fp32,bf16 --fractions least --time-limit 75
stage matrix_googlenet_bf16 100 python3 scripts/matrix_gpu.py --out $OUT/matrix_googlenet_bf16 \
    --in-process --models googlenet --precisions bf16 --fractions least --time-limit 95
