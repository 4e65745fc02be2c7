#!/usr/bin/env bash
# The GPU check, in one command on a machine with a CUDA GPU, from the repository root:
#
#     OUT=/some/dir scripts/gpu_check.sh [kernel-benchmark batch, default 32]
#
# Installs any cuDNN frontend wheel found in .whl/ (machines without a package index) into
# /tmp/site, runs the GPU tests (pytest -m gpu) and a short kernel benchmark against PyTorch,
# and writes full logs under $OUT (default ./gpu_check_out): env.txt, pytest_gpu.log, bench_kernels.log/.json.
# Prints a compact summary; exits non-zero when the tests fail.
# Environment: BENCH_ARGS (extra arguments of the kernel benchmark, e.g. "--convs 4"),
# TEST_TIMEOUT and BENCH_TIMEOUT (seconds, default 420 and 240).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu_check_out}
BATCH=${1:-32}
mkdir -p "$OUT"

if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
# A GPU test that skips (no GPU seen, CuPy not importing) fails the check instead.
export MINIDNN_REQUIRE_GPU=1

{
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown) $(git status --porcelain 2>/dev/null | wc -l) changed files"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 - <<'EOF'
import sys, numpy, cupy, cudnn
print("python", sys.version.split()[0], "numpy", numpy.__version__, "cupy", cupy.__version__,
      "cudnn frontend", cudnn.__version__, "cudnn backend", cudnn.backend_version())
EOF
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

echo "== GPU tests"
timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -q -m gpu -p no:cacheprovider --durations=12 tests 2>&1 | tee "$OUT/pytest_gpu.log" | tail -n 45
status=${PIPESTATUS[0]}

echo "== kernel benchmark (batch $BATCH)"
timeout "${BENCH_TIMEOUT:-240}" python3 scripts/bench_vs_pytorch.py --kernels --batch "$BATCH" \
    ${BENCH_ARGS:-} --out "$OUT/bench_kernels.json" 2>&1 | tee "$OUT/bench_kernels.log" | tail -n 40

exit "$status"
