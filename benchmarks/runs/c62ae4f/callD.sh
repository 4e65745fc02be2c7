#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1 MINIDNN_CACHE=/tmp/cache
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_deterministic_gpu.py 2>&1 | tail -2
run() { timeout 70 python3 -m minidnn train --model vgg16 --data synthetic --batch 64 --steps 3 --no-progress --deterministic --policy dyn --relu-bits "$@" 2>&1; }
out=$(run --memory-budget 1GiB); echo "$out" | tail -1
least=$(echo "$out" | grep -o 'give --memory-budget [^ ]*' | awk '{print $3}')
echo "== at the least budget $least"; run --memory-budget "$least" | tail -3
