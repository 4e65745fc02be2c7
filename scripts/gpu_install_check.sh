#!/usr/bin/env bash
# The GPU install without PyTorch, in one command on a machine with a CUDA GPU (repository root):
#
#     scripts/gpu_install_check.sh              # PyTorch hidden from the import path
#     scripts/gpu_install_check.sh --isolated   # an environment that never had PyTorch
#
# Default: installs the wheels found in .whl/ (or $WHEELS_DIR; machines without a package
# index) into /tmp/site_notorch, or else uses what is installed, and hides PyTorch from the
# import path (a `torch` package that fails to import comes first on PYTHONPATH).
# --isolated: `pip install --no-index` of the gpu extra into a new environment made of only the
# distributions the 'gpu' extra needs, taken from this machine's (scripts/gpu_extra_env.py),
# and the check below runs there, outside the repository.
# Then: trains two steps of a small convolutional network on the GPU in strict FP32 and
# compares its gradients with the CPU's, and prints which libcudnn and libnccl files the
# process loaded. Fails (non-zero) when torch imports, when no GPU is seen, when cuDNN or
# NCCL cannot be loaded, when the loaded cuDNN lies inside a PyTorch install, or when the
# gradients differ.
set -uo pipefail
cd "$(dirname "$0")/.."
export MINIDNN_REQUIRE_GPU=1
HIDE=$(mktemp -d)
trap 'rm -rf "$HIDE"' EXIT
WHEELS=${WHEELS_DIR:-.whl}
PY=python3
if [ "${1:-}" = "--isolated" ]; then
    python3 scripts/gpu_extra_env.py "$HIDE/env" --wheels "$WHEELS" || exit 1
    PY="$HIDE/env/bin/python"
    unset PYTHONPATH
    cd "$HIDE"   # minidnn comes from the environment, not from the checkout
else
    mkdir -p "$HIDE/torch"
    echo 'raise ImportError("PyTorch is hidden by scripts/gpu_install_check.sh")' > "$HIDE/torch/__init__.py"
    SITE=""
    if compgen -G "$WHEELS/*.whl" > /dev/null; then
        python3 -m pip install -q --no-index --no-deps --target /tmp/site_notorch "$WHEELS"/*.whl || exit 1
        SITE=":/tmp/site_notorch"
    fi
    export PYTHONPATH="$HIDE:$PWD$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" - <<'PYTHON'
import sys

import numpy as np


def fail(message):
    print(f"gpu_install_check: FAILED: {message}")
    sys.exit(1)


try:
    import torch
except ImportError as e:
    print(f"torch: does not import ({e})")
else:
    fail(f"torch still imports, from {torch.__file__}")

from minidnn import Executor, models
from minidnn.backend import gpu_available, gpu_unavailable_reason
from minidnn.kernels import nvidia_libraries
import minidnn
print(f"minidnn: {minidnn.__file__}")

if not gpu_available():
    fail(f"CuPy sees no CUDA device ({gpu_unavailable_reason()})")
for name in ("cudnn", "nccl"):
    print(f"{name}: in its pip package at {nvidia_libraries.package_library(name)}; "
          f"found without help: {nvidia_libraries.found_without_help(name)}")

rng = np.random.default_rng(0)
x = rng.standard_normal((8, 3, 16, 16)).astype(np.float32)
y = rng.integers(0, 10, 8)
grads = {}
for device in ("cpu", "gpu"):
    net = models.build("tiny_cnn", num_classes=10, image_size=16)
    with Executor(net, 8, device=device, seed=0, math="fp32", deterministic=True) as ex:
        ex.forward(x, y, dropout=False)
        ex.backward()
        grads[device] = ex.gradients()
worst = max(float(np.abs(grads["gpu"][k] - v).max() / (np.abs(v).max() + 1e-12))
            for k, v in grads["cpu"].items())
print(f"convolution forward and backward on the GPU: largest relative difference from the "
      f"CPU {worst:.2e}")
if not worst < 1e-4:
    fail("the GPU gradients differ from the CPU's")

nvidia_libraries.preload("nccl")
try:
    from cupy.cuda import nccl
    print(f"NCCL {nccl.get_version()} loads")
except Exception as e:
    fail(f"NCCL does not load: {type(e).__name__}: {e}")

loaded = sorted({line.split()[-1] for line in open("/proc/self/maps")
                 if "libcudnn.so" in line or "libnccl.so" in line})
for path in loaded:
    print(f"loaded: {path}")
if not any("libcudnn.so" in p for p in loaded):
    fail("no libcudnn was loaded")
# PyTorch's own copy would sit in its package folder (site-packages/torch/lib); the
# nvidia-cudnn-cu13 package's is site-packages/nvidia/cudnn/lib, whatever the environment's name.
if any("libcudnn.so" in p and "/site-packages/torch/" in p for p in loaded):
    fail("the cuDNN loaded is PyTorch's")
print("gpu_install_check: OK")
PYTHON
