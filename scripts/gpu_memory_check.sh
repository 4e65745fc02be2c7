#!/usr/bin/env bash
# The memory manager on the GPU, in one command on a machine with a CUDA GPU (repository root):
#
#     OUT=/some/dir scripts/gpu_memory_check.sh
#
# 1. every GPU test (pytest -m gpu); 2. the README's main job on the GPU, with its run report;
# 3. VGG-16 at batch 256 without offload (no budget) and under vDNN_all in a 12 GiB budget for
# 200 steps (speed, peak, bytes moved, arena level after every step: no leak), with a trace and
# a memory plot of one step each, vDNN_conv in 12 GiB for 20 steps, and none / all with ReLU
# bit masks in 12 GiB; 4. the PyTorch comparison of scripts/bench_vs_pytorch.py.
# SKIP_MAIN=1 skips step 2; PT_RUNS="" skips step 4. Everything is logged to $OUT/run.log;
# traces, plots and reports land beside it. Exits with pytest's status (non-zero when a GPU
# test fails or skips: MINIDNN_REQUIRE_GPU=1).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu_check_out}
mkdir -p "$OUT/tr"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
# A GPU test that skips (no GPU seen, CuPy not importing) fails the check instead.
export MINIDNN_REQUIRE_GPU=1
STEPS=${STEPS:-200}
log() { echo "== $*" | tee -a "$OUT/run.log"; }
{
    echo "commit: $(git rev-parse HEAD 2>/dev/null) ($(git status --porcelain 2>/dev/null | wc -l) changed files)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
} 2>&1 | tee -a "$OUT/run.log"

log "GPU tests"
timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider --continue-on-collection-errors tests 2>&1 \
    | tee "$OUT/pytest_gpu.log" | tail -n 25 | tee -a "$OUT/run.log"
status=${PIPESTATUS[0]}

if [ -z "${SKIP_MAIN:-}" ]; then
    log "main job: python3 -m minidnn train --no-progress --report $OUT/main_report.json"
    timeout 120 python3 -m minidnn train --no-progress --report "$OUT/main_report.json" 2>&1 \
        | tail -n 12 | tee -a "$OUT/run.log"
fi

log "VGG-16 b256, policy none, no budget"
timeout 150 python3 scripts/bench_memory.py --model vgg16 --batch 256 --policies none \
    --steps 20 --warmup 3 --trace-dir "$OUT/tr" 2>&1 | tail -n 15 | tee -a "$OUT/run.log"

log "VGG-16 b256, policy all, 12 GiB budget, $STEPS steps"
timeout 300 python3 scripts/bench_memory.py --model vgg16 --batch 256 --policies all \
    --memory-budget 12GiB --steps "$STEPS" --warmup 3 --trace-dir "$OUT/tr" 2>&1 \
    | tail -n 15 | tee -a "$OUT/run.log"

log "VGG-16 b256, policy conv, 12 GiB budget"
timeout 150 python3 scripts/bench_memory.py --model vgg16 --batch 256 --policies conv \
    --memory-budget 12GiB --steps 20 --warmup 3 2>&1 | tail -n 15 | tee -a "$OUT/run.log"

log "VGG-16 b256 with ReLU bit masks, policies none and all, 12 GiB budget"
timeout 200 python3 scripts/bench_memory.py --model vgg16 --batch 256 --policies none,all \
    --relu-bits --memory-budget 12GiB --steps 20 --warmup 3 2>&1 | tail -n 15 | tee -a "$OUT/run.log"

[ "${PT_RUNS-x}" = "" ] && exit "$status"
log "PyTorch comparison"
timeout "${PT_TIMEOUT:-200}" python3 scripts/bench_vs_pytorch.py --runs ${PT_RUNS:-vgg16:256:tf32 alexnet:256:tf32} \
    --steps 5 --warmup 2 --timeout 120 --out "$OUT/bench_pytorch.json" 2>&1 | tail -n 20 | tee -a "$OUT/run.log"
exit "$status"
