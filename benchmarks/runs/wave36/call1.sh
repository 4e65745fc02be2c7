#!/usr/bin/env bash
# Call 1: GoogLeNet TF32 under 6 and 4 GiB (its unconstrained peak is 6.05 GiB) beside
# PyTorch's channels_last accumulation 2, eager and compiled (the compiled graph of passes of
# 128 is the same under both caps, so the second compilation may come from Inductor's cache).
set -u
. benchmarks/stages.sh call1 585
stage budget_googlenet_tf32 570 python3 scripts/bench_budget.py --model googlenet --batch 256 \
    --math tf32 --caps 6GiB,4GiB --accumulate 2 --layouts channels_last --segments "" \
    --no-whole-batch --timeout 220 --time-limit 565 --out $OUT/budget_googlenet_tf32
