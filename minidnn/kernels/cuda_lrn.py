"""Local response normalization across channels on the GPU (CuPy ElementwiseKernels).

PyTorch's LocalResponseNorm, as cpu.py: for channel c the window is c - size//2 ..
c + (size-1)//2 (zero outside), scale = k + alpha/size * sum of x**2 over it, y = x * scale**-beta.
Backward runs one thread per input element and sums over the windows that contain it (the
mirror image of its own window), so it needs no atomics and is deterministic:

    gx_c = gy_c * s_c**-beta - 2 alpha beta / size * x_c * sum_{j: c in window(j)} gy_j x_j s_j**(-beta-1)

float32 and float64; no allocation, no host synchronization. Shapes: x, y, scale, gy, gx
(N, C, H, W), all C-contiguous or all channels last (kernels/mapformat.py). The kernels run
over the values in memory order; a value's channel neighbours lie CS values away (CS = H*W in
NCHW, 1 in NHWC), so one kernel serves both layouts.
"""
from __future__ import annotations

import cupy as cp

from .cpu import _lrn_reach
from .mapformat import common_layout, in_memory_order

_lrn_forward = cp.ElementwiseKernel(
    "raw T x, int32 C, int64 CS, int32 before, int32 after, float64 alpha_over_size, "
    "float64 k, float64 beta",
    "T y, T scale",
    r"""
    const int c = (int)((i / CS) % C);
    const long long base = i - c * CS;                       // channel 0 at this pixel
    const int lo = max(c - before, 0), hi = min(c + after, C - 1);
    T sum = 0;
    for (int j = lo; j <= hi; ++j) { const T v = x[base + j * CS]; sum += v * v; }
    const T s = sum * (T)alpha_over_size + (T)k;
    scale = s;
    y = x[i] * pow(s, (T)(-beta));
    """,
    "minidnn_lrn_forward")

_lrn_backward = cp.ElementwiseKernel(
    "raw T x, raw T scale, raw T gy, int32 C, int64 CS, int32 before, int32 after, "
    "float64 coef, float64 beta",
    "T gx",
    r"""
    const int c = (int)((i / CS) % C);
    const long long base = i - c * CS;
    // Channel c lies in the windows of channels c - after .. c + before.
    const int lo = max(c - after, 0), hi = min(c + before, C - 1);
    const T nb = (T)(-beta);
    T acc = 0;
    for (int j = lo; j <= hi; ++j) {
        const long long o = base + j * CS;
        const T s = scale[o];
        acc += gy[o] * x[o] * pow(s, nb) / s;
    }
    gx = gy[i] * pow(scale[i], nb) - (T)coef * x[i] * acc;
    """,
    "minidnn_lrn_backward")



def _channel_step(name: str, arrays) -> int:
    """Values between channel neighbours in the arrays' common layout."""
    n, c, h, w = arrays[0].shape
    return 1 if common_layout(name, arrays) == "nhwc" else h * w


def lrn_forward(x, y, scale, spec) -> None:
    """scale = k + alpha/size * window sum of x**2; y = x * scale**-beta."""
    step = _channel_step("lrn_forward", (x, y, scale))
    before, after = _lrn_reach(spec.size)
    _lrn_forward(in_memory_order(x), x.shape[1], step, before, after, spec.alpha / spec.size,
                 spec.k, spec.beta, in_memory_order(y), in_memory_order(scale))


def lrn_backward(x, y, scale, gy, gx, spec) -> None:
    """gx from x, scale and gy (y is not read and may be None); overwrites gx."""
    step = _channel_step("lrn_backward", (x, scale, gy, gx))
    before, after = _lrn_reach(spec.size)
    _lrn_backward(in_memory_order(x), in_memory_order(scale), in_memory_order(gy), x.shape[1],
                  step, before, after, 2.0 * spec.alpha * spec.beta / spec.size, spec.beta,
                  in_memory_order(gx))
