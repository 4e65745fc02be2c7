#!/usr/bin/env bash
# The GPU run behind benchmarks/RESULTS.md, in one command on a CUDA machine (repository root):
#
#     OUT=/some/dir scripts/gpu_results.sh
#
# 1. every GPU test (pytest -m gpu, a GPU skip is a failure);
# 2. whole VGG-16 steps at batch 256 against PyTorch's best configurations of the same
#    precision (channels_last; bf16 autocast + channels_last), each in its own process;
# 3. VGG-16 b256 under 12 GiB and 4 GiB: minidnn's dyn plan against PyTorch's gradient
#    accumulation in channels_last (the fastest PyTorch configurations under those caps);
# 4. with two GPUs: data parallel, minidnn --ranks 2 against DistributedDataParallel;
# 5. ResNet-50 b256 against PyTorch channels_last;
# 6. the GPU install without PyTorch on the import path;
# 7. VGG-16 b256 split into 8 micro-batches without a budget (what a split step costs);
# 8. AlexNet, OverFeat and ResNet-50 b256 against PyTorch's best in TF32 and bf16, and VGG-16
#    with and without the bias in the ReLU (minidnn/fusion.py);
# 9. the GPU soak: 2000 steps of VGG-16 b64 under dyn in 4 GiB (scripts/soak.py).
# Each part has its own time limit (seconds: T_TESTS, T_STEPS, T_BUDGET, T_DDP); everything is
# logged under $OUT. Exits with the GPU tests' status.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu_check_out}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
export MINIDNN_REQUIRE_GPU=1
log() { echo "== $*" | tee -a "$OUT/run.log"; }
{
    echo "commit: $(git rev-parse HEAD 2>/dev/null) ($(git status --porcelain 2>/dev/null | wc -l) changed files)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
} 2>&1 | tee -a "$OUT/run.log"
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)

log "GPU tests"
timeout "${T_TESTS:-130}" python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 \
    | tee "$OUT/pytest_gpu.log" | tail -n 15 | tee -a "$OUT/run.log"
status=${PIPESTATUS[0]}

log "whole steps against PyTorch: VGG-16"
timeout "${T_STEPS:-90}" python3 scripts/bench_vs_pytorch.py --runs vgg16:256:tf32 \
    --frameworks minidnn pytorch-cl pytorch-cl-bf16 --steps 5 --warmup 2 --timeout 45 \
    --out "$OUT/steps_vgg16.json" 2>&1 | tail -n 6 | tee -a "$OUT/run.log"
timeout 35 python3 scripts/bench_vs_pytorch.py --runs vgg16:256:bf16 --frameworks minidnn \
    --steps 5 --warmup 2 --timeout 30 --out "$OUT/steps_bf16.json" 2>&1 | tail -n 3 | tee -a "$OUT/run.log"

log "VGG-16 b256 under 12 GiB and 4 GiB"
timeout "${T_BUDGET:-230}" python3 scripts/bench_budget.py --caps 12GiB,4GiB --accumulate 2,16 \
    --segments "" --layouts channels_last --no-whole-batch --warmup 2 --steps 4 --timeout 110 \
    --out "$OUT/budget" 2>&1 | tail -n 20 | tee -a "$OUT/run.log"

if [ "$gpus" -ge 2 ] && [ -f scripts/bench_ddp.py ]; then
    log "data parallel on $gpus GPUs"
    timeout "${T_DDP:-90}" python3 scripts/bench_ddp.py "$OUT/ddp.json" --steps 8 --warmup 3 \
        --timeout 45 --only minidnn-1gpu,minidnn-2gpu,pytorch-ddp 2>&1 | tail -n 10 | tee -a "$OUT/run.log"
fi

log "whole steps against PyTorch: ResNet-50"
timeout "${T_STEPS:-90}" python3 scripts/bench_vs_pytorch.py --runs resnet50:256:tf32 \
    --frameworks minidnn pytorch-cl --steps 5 --warmup 2 --timeout 40 \
    --out "$OUT/steps_resnet50.json" 2>&1 | tail -n 5 | tee -a "$OUT/run.log"

log "install without PyTorch"
timeout 40 bash scripts/gpu_install_check.sh 2>&1 | tail -n 6 | tee -a "$OUT/run.log"

log "VGG-16 b256 as 8 micro-batches, no budget"
timeout 45 python3 -m minidnn train --model vgg16 --data synthetic --batch 256 --micro-batches 8 \
    --steps 6 --eval-every 0 --no-progress --report "$OUT/split8.json" 2>&1 | tail -n 3 | tee -a "$OUT/run.log"
log "whole steps against PyTorch: AlexNet, OverFeat, ResNet-50; the fused bias"
timeout "${T_MORE:-300}" python3 scripts/bench_vs_pytorch.py --runs alexnet:256:tf32 \
    overfeat:256:tf32 alexnet:256:bf16 overfeat:256:bf16 --frameworks minidnn pytorch-cl \
    pytorch-cl-bf16 --steps 5 --warmup 2 --timeout 60 --out "$OUT/steps_more.json" 2>&1 \
    | tail -n 16 | tee -a "$OUT/run.log"
timeout "${T_STEPS:-90}" python3 scripts/bench_vs_pytorch.py --runs vgg16:256:tf32 \
    --frameworks minidnn minidnn-unfused --steps 5 --warmup 2 --timeout 40 \
    --out "$OUT/steps_fusion.json" 2>&1 | tail -n 4 | tee -a "$OUT/run.log"

log "soak: 2000 steps of VGG-16 b64, dyn, 4 GiB"
timeout "${T_SOAK:-420}" python3 scripts/soak.py --device gpu --model vgg16 --image-size 224 \
    --batch 64 --policy dyn --memory-budget 4GiB --steps 2000 --every 250 --data synthetic \
    2>&1 | tee "$OUT/soak_gpu.log" | tail -n 12 | tee -a "$OUT/run.log"
exit "$status"
