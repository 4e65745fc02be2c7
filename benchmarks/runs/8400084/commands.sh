#!/usr/bin/env bash
# The GPU calls behind "The fifth wave: bf16 computed natively" in benchmarks/RESULTS.md, each on
# a machine with one H200 (nvidia-h200), from the repository root, after installing the cuDNN
# frontend wheel:
#     python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#     export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1
# call3 ran the tree of 8400084 without its last change (a batch's passes sharing one bf16
# copy of each weight); call5 ran 8400084. What came back is in the call's folder.
set -u

call3() {
  python3 -m pytest -q -p no:cacheprovider -m gpu -k "not two_gpus" --maxfail=25 tests > $OUT/tests.log 2>&1
  for p in fp32 bf16; do
    python3 -m minidnn train --device gpu --precision $p --no-progress > $OUT/main_$p.log 2>&1
  done
  python3 scripts/bench_vs_pytorch.py --runs vgg16:256:bf16 alexnet:256:bf16 overfeat:256:bf16 \
      --frameworks minidnn pytorch-cl-bf16 --steps 20 --warmup 3 --timeout 80 --out $OUT/steps_bf16.json
  python3 scripts/bench_vs_pytorch.py --runs vgg16:256:tf32 --frameworks minidnn pytorch-cl \
      --steps 10 --warmup 3 --timeout 45 --out $OUT/steps_tf32.json
}

call5() {
  python3 -m pytest -q -p no:cacheprovider -m gpu --maxfail=20 tests/test_bf16_gpu.py tests/test_precision.py \
      tests/test_memory_gpu.py tests/test_micro_batches_gpu.py tests/test_layers_gpu.py tests/test_runs_gpu.py \
      > $OUT/tests.log 2>&1
  python3 scripts/bench_vs_pytorch.py --runs vgg16:256:bf16 alexnet:256:bf16 overfeat:256:bf16 \
      --frameworks minidnn pytorch-cl-bf16 --steps 20 --warmup 3 --timeout 60 --out $OUT/steps_bf16.json
  python3 scripts/bench_budget.py --model vgg16 --batch 256 --caps 6GiB --math bf16 \
      --accumulate 2,4,8,16 --layouts channels_last,nchw --segments "" \
      --warmup 2 --steps 4 --timeout 120 --time-limit 300 --out $OUT/budget_bf16
}
