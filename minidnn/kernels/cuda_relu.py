"""ReLU forward and backward as single CuPy elementwise kernels.

The NumPy-style expressions cost an extra pass each on the GPU (backward builds the boolean
mask `y > 0` as a temporary before the product); these read each operand once and write once,
so they run at memory bandwidth. Both may run in place (y is x, gx is gy).
"""
from __future__ import annotations

import cupy as cp

_relu_forward = cp.ElementwiseKernel("T x", "T y", "y = x > (T)0 ? x : (T)0", "minidnn_relu_forward")
_relu_backward = cp.ElementwiseKernel("T y, T gy", "T gx", "gx = y > (T)0 ? gy : (T)0",
                                      "minidnn_relu_backward")


def relu_forward(x, y) -> None:
    """y = max(x, 0). x, y: same shape and dtype, contiguous."""
    _relu_forward(x, y)


def relu_backward(y, gy, gx) -> None:
    """gx = gy where y > 0, else 0."""
    _relu_backward(y, gy, gx)
