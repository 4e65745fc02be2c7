#!/usr/bin/env bash
# Call 5: the input batches a caller holds counted at their float32 bytes: ResNet-50 bf16 in
# 6 GiB again (whole-batch statistics, which ran short in calls 3 and 4; split statistics),
# predicted peak beside measured.
set -u
. benchmarks/stages.sh call5 150
stage probe_whole 60 python3 benchmarks/runs/wave28/peak_probe.py --budget 6GiB
stage probe_split 50 python3 benchmarks/runs/wave28/peak_probe.py --budget 6GiB \
    --split-batch-statistics
