#!/usr/bin/env bash
# Call 4: what holds the arena of ResNet-50 bf16 in 6 GiB (whole-batch statistics, which ran
# short in call 3; with ReLU bit masks kept and left off; split statistics, whose measured peak
# was above the predicted one), beside the step model's levels.
set -u
. benchmarks/stages.sh call4 220
stage probe_whole_off 60 python3 benchmarks/runs/wave28/peak_probe.py --budget 6GiB
stage probe_whole_kept 60 python3 benchmarks/runs/wave28/peak_probe.py --budget 6GiB --masks kept
stage probe_split_off 50 python3 benchmarks/runs/wave28/peak_probe.py --budget 6GiB \
    --split-batch-statistics
stage probe_split_kept 40 python3 benchmarks/runs/wave28/peak_probe.py --budget 6GiB \
    --split-batch-statistics --masks kept
