"""Max and average pooling on the GPU as CuPy ElementwiseKernels (float32 and float64).

Forward runs one thread per output element. Backward runs one thread per *input* element and
gathers from the windows that cover it, in a fixed order: no atomics, so the result is the
same bit for bit on every run. Semantics are cpu.py's (PyTorch's): max-pool padding never wins,
ties keep the first maximum in (kh, kw) order and argmax is kh * KW + kw within the window;
avg-pool divides by the window size counting padding (count_include_pad) but never the part of
a ceil_mode window past the padding.

The kernels allocate nothing and never synchronize with the host; they run on CuPy's current
stream. Shapes: x, gx (N, C, H, W); y, gy, argmax (N, C, OH, OW).
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from ..errors import ConfigError

_GEOMETRY = ("int32 H, int32 W, int32 OH, int32 OW, int32 KH, int32 KW, int32 SH, int32 SW, "
             "int32 PH, int32 PW")

_maxpool_forward = cp.ElementwiseKernel(
    "raw T x, " + _GEOMETRY + ", float64 neg_inf",
    "T y, uint8 argmax",
    r"""
    const int ow = (int)(i % OW);
    const int oh = (int)((i / OW) % OH);
    const long long base = (i / ((long long)OW * OH)) * H * W;   // plane n * C + c
    const int h0 = oh * SH - PH, w0 = ow * SW - PW;
    // Window position 0 (padding reads as -inf) starts the search; a later position wins only
    // when strictly greater, as in cpu.py, so ties keep the first and padding never wins.
    T best = (h0 >= 0 && h0 < H && w0 >= 0 && w0 < W) ? x[base + (long long)h0 * W + w0]
                                                      : (T)neg_inf;
    int arg = 0;
    for (int kh = 0; kh < KH; ++kh) {
        const int h = h0 + kh;
        if (h < 0 || h >= H) continue;
        for (int kw = 0; kw < KW; ++kw) {
            const int w = w0 + kw;
            if ((kh == 0 && kw == 0) || w < 0 || w >= W) continue;
            const T v = x[base + (long long)h * W + w];
            if (v > best) { best = v; arg = kh * KW + kw; }
        }
    }
    y = best;
    argmax = (unsigned char)arg;
    """,
    "minidnn_maxpool2d_forward")

# The output rows whose windows cover input row h: oh * SH - PH <= h <= oh * SH - PH + KH - 1.
_COVERING = r"""
    const int a_h = h + PH - KH + 1, a_w = w + PW - KW + 1;
    const int oh_lo = a_h > 0 ? (a_h + SH - 1) / SH : 0;
    const int ow_lo = a_w > 0 ? (a_w + SW - 1) / SW : 0;
    const int oh_hi = min((h + PH) / SH, OH - 1);
    const int ow_hi = min((w + PW) / SW, OW - 1);
"""

_maxpool_backward = cp.ElementwiseKernel(
    "raw T gy, raw uint8 argmax, " + _GEOMETRY,
    "T gx",
    r"""
    const int w = (int)(i % W);
    const int h = (int)((i / W) % H);
    const long long obase = (i / ((long long)W * H)) * OH * OW;
    """ + _COVERING + r"""
    T acc = 0;
    for (int oh = oh_lo; oh <= oh_hi; ++oh) {
        const int kh = h - (oh * SH - PH);
        for (int ow = ow_lo; ow <= ow_hi; ++ow) {
            const long long o = obase + (long long)oh * OW + ow;
            if (argmax[o] == kh * KW + (w - (ow * SW - PW))) acc += gy[o];
        }
    }
    gx = acc;
    """,
    "minidnn_maxpool2d_backward")

# Window [start, start + K) clipped to the padding, then to the input (PyTorch's divisor rule).
_AVG_WINDOW = r"""
    const int hs0 = oh * SH - PH, ws0 = ow * SW - PW;
    const int he0 = min(hs0 + KH, H + PH), we0 = min(ws0 + KW, W + PW);
    const int hs = max(hs0, 0), ws = max(ws0, 0), he = min(he0, H), we = min(we0, W);
    const int count = count_include_pad ? (he0 - hs0) * (we0 - ws0) : (he - hs) * (we - ws);
"""

_avgpool_forward = cp.ElementwiseKernel(
    "raw T x, " + _GEOMETRY + ", bool count_include_pad",
    "T y",
    r"""
    const int ow = (int)(i % OW);
    const int oh = (int)((i / OW) % OH);
    const long long base = (i / ((long long)OW * OH)) * H * W;
    """ + _AVG_WINDOW + r"""
    T acc = 0;
    for (int h = hs; h < he; ++h)
        for (int w = ws; w < we; ++w) acc += x[base + (long long)h * W + w];
    y = count > 0 ? acc / (T)count : (T)0;
    """,
    "minidnn_avgpool2d_forward")

_avgpool_backward = cp.ElementwiseKernel(
    "raw T gy, " + _GEOMETRY + ", bool count_include_pad",
    "T gx",
    r"""
    const int w = (int)(i % W);
    const int h = (int)((i / W) % H);
    const long long obase = (i / ((long long)W * H)) * OH * OW;
    """ + _COVERING + r"""
    T acc = 0;
    for (int oh = oh_lo; oh <= oh_hi; ++oh) {
        for (int ow = ow_lo; ow <= ow_hi; ++ow) {
            """ + _AVG_WINDOW + r"""
            if (count > 0) acc += gy[obase + (long long)oh * OW + ow] / (T)count;
        }
    }
    gx = acc;
    """,
    "minidnn_avgpool2d_backward")


def _geometry(x_shape, y_shape, spec) -> tuple:
    (h, w), (oh, ow) = x_shape[2:], y_shape[2:]
    (kh, kw), (sh, sw), (ph, pw) = spec.kernel, spec.stride, spec.padding
    return h, w, oh, ow, kh, kw, sh, sw, ph, pw


def maxpool2d_forward(x, y, argmax, spec) -> None:
    """y = window maxima of x; argmax (uint8) = kh * KW + kw of each window's first maximum."""
    kh, kw = spec.kernel
    if kh * kw > 256:
        raise ConfigError(f"max-pool window {kh}x{kw} has more than 256 positions, which a "
                          f"uint8 argmax cannot index")
    _maxpool_forward(x, *_geometry(x.shape, y.shape, spec), -np.inf, y, argmax)


def maxpool2d_backward(gy, argmax, gx, spec) -> None:
    """gx = gy routed to each window's winner (summed where windows overlap); overwrites gx."""
    _maxpool_backward(gy, argmax, *_geometry(gx.shape, gy.shape, spec), gx)


def avgpool2d_forward(x, y, spec) -> None:
    """y = window means of x (zero padding; divisor per spec.count_include_pad)."""
    _avgpool_forward(x, *_geometry(x.shape, y.shape, spec), bool(spec.count_include_pad), y)


def avgpool2d_backward(gy, gx, spec) -> None:
    """gx = each gy / divisor spread over its window; overwrites gx."""
    _avgpool_backward(gy, *_geometry(gx.shape, gy.shape, spec), bool(spec.count_include_pad), gx)
