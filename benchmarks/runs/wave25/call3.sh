#!/usr/bin/env bash
# Call 3: call 2 again after its fix. A projection block's add writes the gradient it hands
# its batch norm in place into gy, which handed_sums refused; now allowed and tested. The
# GPU tests of the add's sums, the two ways timed (bf16 too: the maps now made on the
# device), ResNet-50 in TF32 and bf16 beside PyTorch's compiled step, VGG-16 TF32 beside it.
set -u
. benchmarks/stages.sh call3 575
stage gpu_tests 80 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_batchnorm_fused.py \
    tests/test_gpu_add_relu.py -k "handed or sums or batch_norms"
stage handed_sums_clock 50 python3 benchmarks/runs/wave25/handed_sums_clock.py
stage bench_resnet50_tf32 140 python3 scripts/bench_vs_pytorch.py --runs resnet50:256:tf32 \
    --frameworks minidnn pytorch-cl-compiled --steps 10 --warmup 3 --profile --timeout 125 \
    --out $OUT/bench_resnet50_tf32.json
stage bench_resnet50_bf16 110 python3 scripts/bench_vs_pytorch.py --runs resnet50:256:bf16 \
    --frameworks minidnn pytorch-cl-bf16-compiled --steps 10 --warmup 3 --timeout 100 \
    --out $OUT/bench_resnet50_bf16.json
stage bench_vgg16_tf32 110 python3 scripts/bench_vs_pytorch.py --runs vgg16:256:tf32 \
    --frameworks minidnn pytorch-cl-compiled --steps 10 --warmup 3 --timeout 100 \
    --out $OUT/bench_vgg16_tf32.json
