#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1
nvidia-smi --query-gpu=name --format=csv,noheader
( CUDA_VISIBLE_DEVICES=1 timeout 185 python3 scripts/soak.py --device gpu --model vgg16 --image-size 224 \
    --batch 64 --policy dyn --memory-budget 4GiB --steps 2000 --every 250 --data synthetic \
    > $OUT/soak_gpu.log 2>&1; echo "soak rc $?" >> $OUT/soak_gpu.log ) &
SOAK=$!
export CUDA_VISIBLE_DEVICES=0
echo "== tests"
timeout 60 python3 -m pytest -q -p no:cacheprovider -m "gpu and not slow" tests/test_pointwise_gpu.py \
    tests/test_pool_gpu.py tests/test_batchnorm.py tests/test_draws.py tests/test_runs_gpu.py \
    tests/test_micro_batches_gpu.py > $OUT/tests.log 2>&1; echo "tests rc $?"; tail -4 $OUT/tests.log
echo "== steps"
timeout 130 python3 scripts/bench_vs_pytorch.py --runs vgg16:256:tf32 resnet50:256:tf32 \
    --frameworks minidnn pytorch-cl --steps 5 --warmup 2 --timeout 60 --out $OUT/steps.json \
    > $OUT/steps.log 2>&1; tail -8 $OUT/steps.log
wait $SOAK; tail -12 $OUT/soak_gpu.log
unset CUDA_VISIBLE_DEVICES
echo "== host link"
timeout 25 python3 scripts/bench_host_link.py --json $OUT/host_link.json > $OUT/host_link.log 2>&1; tail -8 $OUT/host_link.log
echo "== ddp"
timeout 75 python3 scripts/bench_ddp.py $OUT/ddp.json --steps 8 --warmup 3 --timeout 70 \
    --only minidnn-2gpu,pytorch-ddp > $OUT/ddp.log 2>&1; tail -6 $OUT/ddp.log
echo "== ddp dyn"
timeout 200 python3 scripts/bench_ddp.py $OUT/ddp_dyn.json --steps 8 --warmup 3 --timeout 150 \
    --only minidnn-1gpu-dyn,minidnn-2gpu-dyn > $OUT/ddp_dyn.log 2>&1; tail -6 $OUT/ddp_dyn.log
# then, on the same machine (two H200s, GPU 0 alone, nothing else running):
#   CUDA_VISIBLE_DEVICES=0 python3 scripts/bench_vs_pytorch.py --runs resnet50:256:tf32 \
#       alexnet:256:tf32 overfeat:256:tf32 --frameworks minidnn pytorch-cl --steps 5 --warmup 2 \
#       --timeout 50 --out $OUT/steps2.json
