#!/usr/bin/env bash
# Call 2: PyTorch's GoogLeNet TF32 accumulation 4 under 6 GiB and 4 and 8 under 4 GiB (call 1:
# accumulation 2 ran out of memory eager under both caps, compiled under 4 GiB); then VGG-16
# fp32's matrix cells at 75, 50 and 35% with the call gap (estimated at about 1.08 before).
set -u
. benchmarks/stages.sh call2 585
stage budget_googlenet_tf32_6gib 150 python3 scripts/bench_budget.py --model googlenet \
    --batch 256 --math tf32 --caps 6GiB --accumulate 4 --layouts channels_last --segments "" \
    --no-whole-batch --only torch --timeout 140 --time-limit 145 \
    --out $OUT/budget_googlenet_tf32_6gib
stage budget_googlenet_tf32_4gib 230 python3 scripts/bench_budget.py --model googlenet \
    --batch 256 --math tf32 --caps 4GiB --accumulate 4,8 --layouts channels_last --segments "" \
    --no-whole-batch --only torch --timeout 140 --time-limit 225 \
    --out $OUT/budget_googlenet_tf32_4gib
stage matrix_vgg16_fp32 200 python3 scripts/matrix_gpu.py --out $OUT/matrix_vgg16_fp32 \
    --in-process --models vgg16 --precisions fp32 --fractions 0.75,0.5,0.35 --time-limit 195
