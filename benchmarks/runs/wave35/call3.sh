#!/usr/bin/env bash
# Call 3: the profile's call gap (Profile.call_gap_s) in the step model. Its GPU test; AlexNet's
# 64 passes of 4 with nothing offloaded, fused and not, beside the step model again (wave 34's
# call 4); the matrix cells of passes of a few images (AlexNet and OverFeat at their least
# budgets, where a price per call was feared to push OverFeat bf16 past 1.1) and a cell of
# one pass; OverFeat's pass of 4 in sequence beside its calls alone.
set -u
. benchmarks/stages.sh call3 570
stage gpu_tests 50 python3 -m pytest -q -p no:cacheprovider tests/test_profile_gpu.py
mkdir -p $OUT/runs
for p in fp32 bf16; do
    for f in fused unfused; do
        flag=""; [ $f = unfused ] && flag="--no-fuse"
        stage alexnet_${p}_$f 60 python3 -m minidnn train --model alexnet --data synthetic \
            --batch 256 --steps 12 --precision $p --policy dyn --memory-budget 8GiB \
            --micro-batches 64 --relu-bits --eval-every 0 --eval-batches 1 --no-progress \
            --log-every 12 $flag --report $OUT/runs/alexnet-$p-$f.json
    done
done
stage step_vs_model 40 python3 benchmarks/runs/wave34/step_vs_model.py \
    $OUT/runs/alexnet-fp32-fused.json $OUT/runs/alexnet-fp32-unfused.json \
    $OUT/runs/alexnet-bf16-fused.json $OUT/runs/alexnet-bf16-unfused.json
stage matrix_overfeat 110 python3 scripts/matrix_gpu.py --out $OUT/matrix_overfeat \
    --in-process --models overfeat --precisions fp32,bf16 --fractions 0.5,least \
    --time-limit 105
stage matrix_alexnet 130 python3 scripts/matrix_gpu.py --out $OUT/matrix_alexnet \
    --in-process --models alexnet --precisions fp32,bf16 --fractions 0.5,least \
    --time-limit 125
stage sequence_overfeat_bf16 30 python3 benchmarks/runs/wave35/sequence_clock.py \
    --model overfeat --batch 4 --precision bf16
stage matrix_googlenet 120 python3 scripts/matrix_gpu.py --out $OUT/matrix_googlenet \
    --in-process --models googlenet --precisions bf16 --fractions least --time-limit 115
