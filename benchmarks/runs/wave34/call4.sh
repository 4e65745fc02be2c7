#!/usr/bin/env bash
# Call 4: AlexNet b256 in 64 passes of 4 with nothing offloaded (an 8 GiB budget), fused and
# with --no-fuse, in fp32 and bf16: whether the step model's miss at 4 images is in the
# fused calls it prices from the unfused layers' times.
set -u
. benchmarks/stages.sh call4 400
mkdir -p $OUT/runs
for p in fp32 bf16; do
    for f in fused unfused; do
        flag=""; [ $f = unfused ] && flag="--no-fuse"
        stage alexnet_${p}_$f 80 python3 -m minidnn train --model alexnet --data synthetic \
            --batch 256 --steps 12 --precision $p --policy dyn --memory-budget 8GiB \
            --micro-batches 64 --relu-bits --eval-every 0 --eval-batches 1 --no-progress \
            --log-every 12 $flag --report $OUT/runs/alexnet-$p-$f.json
    done
done
stage step_vs_model 60 python3 benchmarks/runs/wave34/step_vs_model.py \
    $OUT/runs/alexnet-fp32-fused.json $OUT/runs/alexnet-fp32-unfused.json \
    $OUT/runs/alexnet-bf16-fused.json $OUT/runs/alexnet-bf16-unfused.json
