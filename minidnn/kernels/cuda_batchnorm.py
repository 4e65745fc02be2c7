"""Batch normalization on the GPU: CuPy raw kernels with the signatures of cpu_batchnorm.py.

The per-channel sums (sum x, then sum (x - mean)^2 in forward; sum gy and sum gy * (x - mean)
in backward) run in two stages so that every channel uses the whole GPU, however few
channels there are: a grid of (channels, parts) blocks, each adding one contiguous part of
a channel's N * H * W values in double (threads in a fixed stride, then a fixed tree in
shared memory), writes its partial sums; then one thread per channel adds its parts in
order. No atomics anywhere, so the same input gives the same bits every time, which is what
lets the memory manager recompute a batch-norm output in backward exactly. The elementwise
parts (y = x * scale + shift, and gx = a * gy + b * (x - mean) + c) are one thread per value
with per-channel coefficients computed once.

Maps (N, C, H, W) in NCHW or channels-last (NHWC) memory, float32 or float64; per-channel
arrays (C,) of the same dtype. The sums read a map through its strides; the elementwise
kernels index it logically, as CuPy does for any layout.
"""
from __future__ import annotations

import cupy as cp

_THREADS = 256
_PER_BLOCK = 16384          # values of one channel a block adds (the last part: fewer)
_MAX_PARTS = 1024

# mode 0: (x, 0); mode 1: ((x - center)^2, 0); mode 2: (gy, gy * (x - center)).
_SOURCE = r"""
template<typename T>
__global__ void bn_partial_sums(const T* x, const T* gy, const T* center, double* partial,
                                int mode, long long HW, long long count, long long per_block,
                                long long stride_n, long long stride_c, long long stride_p) {
    const int c = blockIdx.x, part = blockIdx.y, parts = gridDim.y;
    const long long begin = (long long)part * per_block;
    const long long end = min(count, begin + per_block);
    const T m = mode == 0 ? (T)0 : center[c];
    double a = 0, b = 0;
    for (long long k = begin + threadIdx.x; k < end; k += blockDim.x) {
        const long long n = k / HW, hw = k - n * HW;
        const long long o = n * stride_n + c * stride_c + hw * stride_p;
        if (mode == 0) {
            a += (double)x[o];
        } else if (mode == 1) {
            const double d = (double)(x[o] - m);
            a += d * d;
        } else {
            const double g = (double)gy[o];
            a += g;
            b += g * (double)(x[o] - m);
        }
    }
    __shared__ double sa[%(threads)d], sb[%(threads)d];
    sa[threadIdx.x] = a;
    sb[threadIdx.x] = b;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            sa[threadIdx.x] += sa[threadIdx.x + s];
            sb[threadIdx.x] += sb[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        partial[2 * ((long long)c * parts + part)] = sa[0];
        partial[2 * ((long long)c * parts + part) + 1] = sb[0];
    }
}
""" % {"threads": _THREADS}

_module = cp.RawModule(code=_SOURCE, options=("--std=c++14",), name_expressions=[
    f"bn_partial_sums<{t}>" for t in ("float", "double")])

# One thread per channel adds its parts in order: (sum a, sum b) per channel, in double.
_add_parts = cp.ElementwiseKernel(
    "raw float64 partial, int32 parts", "float64 sum_a, float64 sum_b",
    "double a = 0, b = 0; "
    "for (int p = 0; p < parts; ++p) { a += partial[2 * (i * parts + p)]; "
    "b += partial[2 * (i * parts + p) + 1]; } "
    "sum_a = a; sum_b = b;",
    "minidnn_bn_add_parts")

_ctype = {cp.dtype(cp.float32): "float", cp.dtype(cp.float64): "double"}

_scale_shift = cp.ElementwiseKernel(
    "raw T x, raw T scale, raw T shift, int32 C, int64 HW", "T y",
    "const int c = (int)((i / HW) % C); y = x[i] * scale[c] + shift[c];",
    "minidnn_bn_scale_shift")

_grad_input = cp.ElementwiseKernel(
    "raw T x, raw T gy, raw T mean, raw T a, raw T b, raw T c_, int32 C, int64 HW", "T gx",
    "const int c = (int)((i / HW) % C); "
    "gx = gy[i] * a[c] + (x[i] - mean[c]) * b[c] + c_[c];",
    "minidnn_bn_grad_input")


def _geometry(x, gy=None) -> tuple:
    """(N, C, H * W, strides of n, c and a pixel in elements) of a map whose pixels are one
    run (NCHW, NHWC); gy, when given, must be laid out as x."""
    if x.ndim != 4:
        raise ValueError(f"batch norm kernels take (N, C, H, W) maps, got shape {tuple(x.shape)}")
    n, c, h, w = x.shape
    sn, sc, sh, sw = (s // x.itemsize for s in x.strides)
    if (h > 1 and sh != w * sw) or (gy is not None and gy.strides != x.strides):
        raise ValueError(f"batch norm kernels take NCHW or NHWC maps (and gradients laid out "
                         f"as the input), got strides {x.strides}"
                         f"{'' if gy is None else f' and {gy.strides}'}")
    return n, c, h * w, sn, sc, sw


def _channel_sums(mode: int, x, gy, center):
    """(sum a, sum b) per channel, float64 (C,) each, for the kernel's `mode`."""
    n, c, hw, sn, sc, sp = _geometry(x, gy)
    try:
        kernel = _module.get_function(f"bn_partial_sums<{_ctype[cp.dtype(x.dtype)]}>")
    except KeyError:
        raise TypeError(f"batch norm kernels take float32 or float64, got {x.dtype}") from None
    count = n * hw
    parts = max(1, min(_MAX_PARTS, -(-count // _PER_BLOCK)))
    per_block = -(-count // parts)
    partial = cp.empty((c, parts, 2), cp.float64)
    unused = x   # the pointer a mode that does not read gy or center is given
    kernel((c, parts), (_THREADS,),
           (x, gy if gy is not None else unused, center if center is not None else unused,
            partial, cp.int32(mode), cp.int64(hw), cp.int64(count), cp.int64(per_block),
            cp.int64(sn), cp.int64(sc), cp.int64(sp)))
    sum_a, sum_b = cp.empty(c, cp.float64), cp.empty(c, cp.float64)
    _add_parts(partial, cp.int32(parts), sum_a, sum_b)
    return sum_a, sum_b


def batchnorm_stats(x, mean, var) -> None:
    """mean and biased variance of each channel of x (N, C, H, W) into mean, var (C,)."""
    count = x.size // x.shape[1]
    total, _ = _channel_sums(0, x, None, None)
    mean[...] = total / count
    squares, _ = _channel_sums(1, x, None, mean)
    var[...] = squares / count


def batchnorm_forward(x, mean, invstd, weight, bias, y) -> None:
    """y = x * scale + shift with scale = invstd * weight, shift = bias - mean * scale."""
    n, c, hw, *_ = _geometry(x)
    scale = invstd * weight
    shift = bias - mean * scale
    _scale_shift(x, scale, shift, c, hw, y)


def batchnorm_backward(x, gy, mean, invstd, weight, gx, gweight, gbias) -> None:
    """Training-mode gradients, as cpu_batchnorm.batchnorm_backward."""
    n, c, hw, *_ = _geometry(x, gy)
    sum_gy, sum_gy_centred = _channel_sums(2, x, gy, mean)
    istd = invstd.astype(cp.float64)
    gbias[...] = sum_gy
    gweight[...] = sum_gy_centred * istd
    if gx is None:
        return
    count = n * hw
    a = weight.astype(cp.float64) * istd
    b = -a * istd * istd * sum_gy_centred / count
    cc = -a * sum_gy / count
    _grad_input(x, gy, mean, a.astype(x.dtype), b.astype(x.dtype), cc.astype(x.dtype), c, hw, gx)
