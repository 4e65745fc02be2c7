"""Batch normalization on the GPU: CuPy raw kernels with the signatures of cpu_batchnorm.py.

The per-channel sums (mean and variance in forward; sum gy and sum gy * (x - mean) in
backward) run one block per channel: each thread adds a strided share of the channel's
N * H * W values in double, then the block reduces the partial sums in shared memory in a
fixed tree. No atomics, so the same input gives the same bits every time, which is what
lets the memory manager recompute a batch-norm output in backward exactly. The elementwise
parts (y = x * scale + shift, and gx = a * gy + b * (x - mean) + c) are one thread per value
with per-channel coefficients computed once.

Maps (N, C, H, W), contiguous, float32 or float64; per-channel arrays (C,) of the same dtype.
"""
from __future__ import annotations

import cupy as cp

_THREADS = 512

_REDUCE = r"""
template<typename T>
__device__ void block_sum2(double a, double b, double* out_a, double* out_b) {
    __shared__ double sa[%(threads)d], sb[%(threads)d];
    sa[threadIdx.x] = a; sb[threadIdx.x] = b;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) { sa[threadIdx.x] += sa[threadIdx.x + s];
                               sb[threadIdx.x] += sb[threadIdx.x + s]; }
        __syncthreads();
    }
    if (threadIdx.x == 0) { *out_a = sa[0]; *out_b = sb[0]; }
    __syncthreads();
}
""" % {"threads": _THREADS}

_SOURCE = _REDUCE + r"""
template<typename T>
__global__ void bn_stats(const T* x, T* mean, T* var, int N, int C, long long HW) {
    const int c = blockIdx.x;
    const long long count = (long long)N * HW;
    double s = 0, unused = 0, total, m, sq;
    for (long long k = threadIdx.x; k < count; k += blockDim.x) {
        const long long n = k / HW, hw = k - n * HW;
        s += (double)x[(n * C + c) * HW + hw];
    }
    __shared__ double shared_mean;
    block_sum2<T>(s, unused, &total, &unused);
    if (threadIdx.x == 0) shared_mean = total / (double)count;
    __syncthreads();
    m = shared_mean;
    // The variance around the mean (two passes: no cancellation of large squares).
    const T mt = (T)m;
    double v = 0;
    for (long long k = threadIdx.x; k < count; k += blockDim.x) {
        const long long n = k / HW, hw = k - n * HW;
        const T d = x[(n * C + c) * HW + hw] - mt;
        v += (double)d * (double)d;
    }
    block_sum2<T>(v, unused, &sq, &unused);
    if (threadIdx.x == 0) { mean[c] = (T)m; var[c] = (T)(sq / (double)count); }
}

template<typename T>
__global__ void bn_backward_sums(const T* x, const T* gy, const T* mean, double* sums,
                                 int N, int C, long long HW) {
    const int c = blockIdx.x;
    const long long count = (long long)N * HW;
    const T m = mean[c];
    double sg = 0, sgc = 0;
    for (long long k = threadIdx.x; k < count; k += blockDim.x) {
        const long long n = k / HW, hw = k - n * HW;
        const long long o = (n * C + c) * HW + hw;
        const T g = gy[o];
        sg += (double)g;
        sgc += (double)g * (double)(x[o] - m);
    }
    double a, b;
    block_sum2<T>(sg, sgc, &a, &b);
    if (threadIdx.x == 0) { sums[2 * c] = a; sums[2 * c + 1] = b; }
}
"""

_module = cp.RawModule(code=_SOURCE, options=("--std=c++14",), name_expressions=[
    f"{k}<{t}>" for k in ("bn_stats", "bn_backward_sums") for t in ("float", "double")])

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


def _kernel(name: str, dtype):
    try:
        return _module.get_function(f"{name}<{_ctype[cp.dtype(dtype)]}>")
    except KeyError:
        raise TypeError(f"batch norm kernels take float32 or float64, got {dtype}") from None


def _check(x) -> tuple[int, int, int]:
    if x.ndim != 4 or not x.flags.c_contiguous:
        raise ValueError(f"batch norm kernels take contiguous (N, C, H, W) maps, got shape "
                         f"{tuple(x.shape)}")
    n, c, h, w = x.shape
    return n, c, h * w


def batchnorm_stats(x, mean, var) -> None:
    """mean and biased variance of each channel of x (N, C, H, W) into mean, var (C,)."""
    n, c, hw = _check(x)
    _kernel("bn_stats", x.dtype)((c,), (_THREADS,),
                                 (x, mean, var, cp.int32(n), cp.int32(c), cp.int64(hw)))


def batchnorm_forward(x, mean, invstd, weight, bias, y) -> None:
    """y = x * scale + shift with scale = invstd * weight, shift = bias - mean * scale."""
    n, c, hw = _check(x)
    scale = invstd * weight
    shift = bias - mean * scale
    _scale_shift(x, scale, shift, c, hw, y)


def batchnorm_backward(x, gy, mean, invstd, weight, gx, gweight, gbias) -> None:
    """Training-mode gradients, as cpu_batchnorm.batchnorm_backward."""
    n, c, hw = _check(x)
    sums = cp.empty((c, 2), cp.float64)
    _kernel("bn_backward_sums", x.dtype)((c,), (_THREADS,),
                                         (x, gy, mean, sums, cp.int32(n), cp.int32(c),
                                          cp.int64(hw)))
    sum_gy, sum_gy_centred = sums[:, 0], sums[:, 1]
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
