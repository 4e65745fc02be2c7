"""Local response normalization across channels on the GPU (CuPy ElementwiseKernels).

PyTorch's LocalResponseNorm, as cpu.py: for channel c the window is c - size//2 ..
c + (size-1)//2 (zero outside), scale = k + alpha/size * sum of x**2 over it, y = x * scale**-beta.
Backward runs one thread per input element and sums over the windows that contain it (the
mirror image of its own window), so it needs no atomics and is deterministic:

    gx_c = gy_c * s_c**-beta - 2 alpha beta / size * x_c * sum_{j: c in window(j)} gy_j x_j s_j**(-beta-1)

float32 and float64 maps (CuPy elementwise kernels) and bfloat16 maps (mixed precision,
kernels/mapformat.py: raw kernels that read and write the bf16 maps as they are, widen each
value exactly in registers, compute as the float32 kernels compute, and round each output
once; the scale, an aux buffer, stays float32). So a bf16 call gives the bits of the float32
kernels on bf16_to_float of its maps followed by float_to_bf16 of its outputs, with no
float32 map in memory. No allocation, no host synchronization. Shapes: x, y, scale, gy, gx
(N, C, H, W), all C-contiguous or all channels last (kernels/mapformat.py). The kernels run
over the values in memory order; a value's channel neighbours lie CS values away (CS = H*W in
NCHW, 1 in NHWC), so one kernel serves both layouts.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from .cpu import _lrn_reach
from .cuda_pointwise import STORAGE_SOURCE
from .mapformat import common_layout, in_memory_order, is_bfloat16

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

# The same two passes over bf16 maps M (scale float32): the elementwise kernels' arithmetic
# in T = acc_t<M>, on widened values, each output rounded once; a grid-stride loop over n.
_BF16_SOURCE = STORAGE_SOURCE + r"""
template<typename M>
__global__ void lrn_forward_maps(const M* x, M* y, acc_t<M>* scale, int C, long long CS,
                                 int before, int after, double alpha_over_size, double k,
                                 double beta, long long n) {
    typedef acc_t<M> T;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const int c = (int)((i / CS) % C);
        const long long base = i - c * CS;
        const int lo = max(c - before, 0), hi = min(c + after, C - 1);
        T sum = 0;
        for (int j = lo; j <= hi; ++j) { const T v = widen(x[base + j * CS]); sum += v * v; }
        const T s = sum * (T)alpha_over_size + (T)k;
        scale[i] = s;
        y[i] = narrow<M>(widen(x[i]) * pow(s, (T)(-beta)));
    }
}

template<typename M>
__global__ void lrn_backward_maps(const M* x, const acc_t<M>* scale, const M* gy, M* gx,
                                  int C, long long CS, int before, int after, double coef,
                                  double beta, long long n) {
    typedef acc_t<M> T;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const int c = (int)((i / CS) % C);
        const long long base = i - c * CS;
        const int lo = max(c - after, 0), hi = min(c + before, C - 1);
        const T nb = (T)(-beta);
        T acc = 0;
        for (int j = lo; j <= hi; ++j) {
            const long long o = base + j * CS;
            const T s = scale[o];
            acc += widen(gy[o]) * widen(x[o]) * pow(s, nb) / s;
        }
        gx[i] = narrow<M>(widen(gy[i]) * pow(scale[i], nb) - (T)coef * widen(x[i]) * acc);
    }
}
"""
_bf16_module = cp.RawModule(code=_BF16_SOURCE, options=("--std=c++14",),
                            name_expressions=["lrn_forward_maps<bf16>",
                                              "lrn_backward_maps<bf16>"])
_THREADS = 256
_MAX_BLOCKS = 4096


def _run_bf16(name: str, n: int, args: tuple) -> None:
    """Kernel name<bf16> over n values (a grid-stride loop)."""
    if n:
        blocks = min(_MAX_BLOCKS, -(-n // _THREADS))
        _bf16_module.get_function(f"{name}<bf16>")((blocks,), (_THREADS,),
                                                   args + (np.int64(n),))



def _channel_step(name: str, arrays) -> int:
    """Values between channel neighbours in the arrays' common layout."""
    n, c, h, w = arrays[0].shape
    return 1 if common_layout(name, arrays) == "nhwc" else h * w


def lrn_forward(x, y, scale, spec) -> None:
    """scale = k + alpha/size * window sum of x**2; y = x * scale**-beta."""
    step = _channel_step("lrn_forward", (x, y, scale))
    before, after = _lrn_reach(spec.size)
    if is_bfloat16(x.dtype):
        _run_bf16("lrn_forward_maps", x.size,
                  (in_memory_order(x), in_memory_order(y), in_memory_order(scale),
                   np.int32(x.shape[1]), np.int64(step), np.int32(before), np.int32(after),
                   np.float64(spec.alpha / spec.size), np.float64(spec.k),
                   np.float64(spec.beta)))
        return
    _lrn_forward(in_memory_order(x), x.shape[1], step, before, after, spec.alpha / spec.size,
                 spec.k, spec.beta, in_memory_order(y), in_memory_order(scale))


def lrn_backward(x, y, scale, gy, gx, spec) -> None:
    """gx from x, scale and gy (y is not read and may be None); overwrites gx."""
    step = _channel_step("lrn_backward", (x, scale, gy, gx))
    before, after = _lrn_reach(spec.size)
    if is_bfloat16(x.dtype):
        _run_bf16("lrn_backward_maps", x.size,
                  (in_memory_order(x), in_memory_order(scale), in_memory_order(gy),
                   in_memory_order(gx), np.int32(x.shape[1]), np.int64(step),
                   np.int32(before), np.int32(after),
                   np.float64(2.0 * spec.alpha * spec.beta / spec.size),
                   np.float64(spec.beta)))
        return
    _lrn_backward(in_memory_order(x), in_memory_order(scale), in_memory_order(gy), x.shape[1],
                  step, before, after, 2.0 * spec.alpha * spec.beta / spec.size, spec.beta,
                  in_memory_order(gx))
