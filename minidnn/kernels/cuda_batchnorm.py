"""Batch normalization on the GPU: CuPy raw kernels with the signatures of cpu_batchnorm.py.

Two kinds of pass, each at memory speed for both layouts:

* **Per-channel sums** (sum x and sum x^2 in forward; sum gy and sum gy * (x - mean) in
  backward), in double, in two stages with no atomics, so the same input gives the same bits
  every time (which is what lets the memory manager recompute a batch-norm output in backward
  exactly). Stage one: a grid of blocks, each adding one contiguous part of the rows of some
  channels and writing its partial sums; stage two: one block per channel adds its parts in
  a fixed order. How a block reads depends on the layout, so that neighbouring threads read
  neighbouring values:
    NCHW  a block takes one channel; its threads stride over the channel's H * W runs.
    NHWC  the map is a (pixels, C) matrix; a block takes 32 channels x 8 row lanes, a warp
          reads 32 neighbouring channels of one pixel (128 contiguous bytes of float32).
  The forward statistics take one pass: var = E[x^2] - mean^2 in double, which loses nothing
  a float32 map can hold unless |mean| exceeds the standard deviation ~10^4-fold.
* **Per-value affine maps** y = x * scale[c] + shift[c] and gx = gy * a[c] + (x - mean[c]) *
  b[c] + d[c], one thread per 16-byte vector in channels last (launched by cuda_pointwise's
  run_per_pixel: a value's channel is its memory index modulo C), CuPy elementwise kernels
  over logical indices in NCHW.

Maps (N, C, H, W) in NCHW or channels-last (NHWC) memory, float32, float64 or bfloat16;
per-channel arrays (C,) in the dtype the maps compute in (float32 beside bf16 maps).

bf16 maps (mixed precision, kernels/mapformat.py) are read and written as they are: each
value is widened (exactly) in registers, every sum and product is the float32 kernel's, and
each output is rounded once to bf16 (cuda_pointwise's STORAGE_SOURCE). So a call gives the
bits of the float32 kernels on bf16_to_float of its maps followed by float_to_bf16 of its
outputs, with no float32 map in memory: the sums run in the same order, in double, over the
same values.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from .cuda_divide import DIVIDE_SOURCE
from .cuda_pointwise import STORAGE_SOURCE, VECTOR_SOURCE, map_ctype, relu_forward, \
    run_per_pixel
from .mapformat import is_channels_last

_THREADS = 256
_PER_BLOCK = 16384          # NCHW: values of one channel a block adds (the last part: fewer)
_MAX_PARTS = 1024
_TARGET_BLOCKS = 2048       # NHWC: blocks of a reduction, enough to fill the GPU
_PART_THREADS = 128         # threads adding one channel's parts (a power of two)

# mode 0: (x, x^2); mode 1: (gy, gy * (x - center)).
_SOURCE = DIVIDE_SOURCE + VECTOR_SOURCE + STORAGE_SOURCE + r"""
// (a, b) summed over the block's threads (blockDim.x of them, a power of two, at most the
// length of the shared arrays sa, sb) in a fixed tree; every thread gets the totals.
__device__ __forceinline__ void block_sums(double* sa, double* sb, double& a, double& b) {
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
    a = sa[0];
    b = sb[0];
}

template<typename T>
__device__ __forceinline__ void accumulate(int mode, T x, T g, T m, double& a, double& b) {
    if (mode == 0) {
        const double v = (double)x;
        a += v;
        b += v * v;
    } else {
        const double gd = (double)g;
        a += gd;
        b += gd * (double)(x - m);
    }
}

// NCHW (or any map whose pixels are one run): block (c, part) adds part `part` of channel c.
// Maps are M (float, double or bf16), per-channel arrays and arithmetic T = acc_t<M>.
template<typename M>
__global__ void bn_partial_sums(const M* x, const M* gy, const acc_t<M>* center,
                                double* partial, int mode, long long HW, long long count,
                                long long per_block, long long stride_n, long long stride_c,
                                long long stride_p) {
    typedef acc_t<M> T;
    const int c = blockIdx.x, part = blockIdx.y, parts = gridDim.y;
    const long long begin = (long long)part * per_block;
    const long long end = min(count, begin + per_block);
    const T m = mode == 0 ? (T)0 : center[c];
    double a = 0, b = 0;
    for (long long k = begin + threadIdx.x; k < end; k += blockDim.x) {
        const long long n = k / HW, hw = k - n * HW;
        const long long o = n * stride_n + c * stride_c + hw * stride_p;
        accumulate<T>(mode, widen(x[o]), mode == 0 ? (T)0 : widen(gy[o]), m, a, b);
    }
    __shared__ double sa[%(threads)d], sb[%(threads)d];
    block_sums(sa, sb, a, b);
    if (threadIdx.x == 0) {
        partial[2 * ((long long)c * parts + part)] = a;
        partial[2 * ((long long)c * parts + part) + 1] = b;
    }
}

// NHWC: x is (rows, C). Block (part, j) adds rows [part * per_part, ...) of channels
// 32j ... 32j + 31; thread (tx, ty) takes channel 32j + tx and every 8th row from ty; the 8
// row lanes are then added in a fixed order.
template<typename M>
__global__ void bn_column_partial_sums(const M* __restrict__ x, const M* __restrict__ gy,
                                       const acc_t<M>* __restrict__ center, double* partial,
                                       int mode, long long rows, int C, long long per_part) {
    typedef acc_t<M> T;
    const int c = blockIdx.y * 32 + threadIdx.x, part = blockIdx.x, parts = gridDim.x;
    const long long r0 = (long long)part * per_part;
    const long long r1 = min(rows, r0 + per_part);
    double a = 0, b = 0;
    if (c < C) {
        const T m = mode == 0 ? (T)0 : center[c];
        #pragma unroll 4
        for (long long r = r0 + threadIdx.y; r < r1; r += 8) {
            const long long o = r * C + c;
            accumulate<T>(mode, widen(x[o]), mode == 0 ? (T)0 : widen(gy[o]), m, a, b);
        }
    }
    __shared__ double sa[8][32], sb[8][32];
    sa[threadIdx.y][threadIdx.x] = a;
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        double ta = 0, tb = 0;
        #pragma unroll
        for (int j = 0; j < 8; ++j) { ta += sa[j][threadIdx.x]; tb += sb[j][threadIdx.x]; }
        partial[2 * ((long long)c * parts + part)] = ta;
        partial[2 * ((long long)c * parts + part) + 1] = tb;
    }
}

// Stage two: block c adds channel c's parts (partial[c, p, 0..1]) in a fixed order (its
// threads take every blockDim.x-th part, then a fixed tree in shared memory); thread 0 then
// turns the sums into the per-channel results, so that a batch-norm call is three launches.
__device__ __forceinline__ void sum_parts(const double* partial, int parts, double& a,
                                          double& b) {
    const int c = blockIdx.x;
    a = 0;
    b = 0;
    for (int p = threadIdx.x; p < parts; p += blockDim.x) {
        a += partial[2 * ((long long)c * parts + p)];
        b += partial[2 * ((long long)c * parts + p) + 1];
    }
    __shared__ double sa[%(part_threads)d], sb[%(part_threads)d];
    block_sums(sa, sb, a, b);
}

// Forward: from (sum x, sum x^2): mean, var (biased), invstd = 1 / sqrt(var + eps), and the
// affine pass's scale = invstd * weight, shift = bias - mean * scale; with update != 0 the
// running estimates move: r = (1 - momentum) * r + momentum * batch value (var unbiased).
template<typename T>
__global__ void bn_finish_forward(const double* partial, int parts, double count, T eps,
                                  T momentum, int update, const T* weight, const T* bias,
                                  T* mean, T* var, T* invstd, T* scale, T* shift,
                                  T* running_mean, T* running_var) {
    double total, squares;
    sum_parts(partial, parts, total, squares);
    if (threadIdx.x != 0) return;
    const int c = blockIdx.x;
    const double m = total / count;
    const T mt = (T)m, vt = (T)fmax(squares / count - m * m, 0.0);
    const T inv = (T)1 / sqrt(vt + eps);
    mean[c] = mt;
    var[c] = vt;
    invstd[c] = inv;
    const T sc = inv * weight[c];
    scale[c] = sc;
    shift[c] = bias[c] - mt * sc;
    if (update) {
        const T keep = (T)1 - momentum;
        running_mean[c] = running_mean[c] * keep + momentum * mt;
        running_var[c] = running_var[c] * keep + (momentum * (T)(count / (count - 1))) * vt;
    }
}

// Backward: from (sum gy, sum gy * (x - mean)): gbias, gweight, and the per-value pass's
// coefficients gx = gy * a + (x - mean) * b + d (cpu_batchnorm.batchnorm_backward).
template<typename T>
__global__ void bn_finish_backward(const double* partial, int parts, double count,
                                   const T* weight, const T* invstd, T* gweight, T* gbias,
                                   T* ca, T* cb, T* cd) {
    double sum_gy, sum_gy_centred;
    sum_parts(partial, parts, sum_gy, sum_gy_centred);
    if (threadIdx.x != 0) return;
    const int c = blockIdx.x;
    const double istd = (double)invstd[c];
    const double a = (double)weight[c] * istd;
    gbias[c] = (T)sum_gy;
    gweight[c] = (T)(sum_gy_centred * istd);
    ca[c] = (T)a;
    cb[c] = (T)(-a * istd * istd * sum_gy_centred / count);
    cd[c] = (T)(-a * sum_gy / count);
}

// Channels last, (pixels, C) in memory: y = x * scale[c] + shift[c], then, with RELU, the
// ReLU after the batch norm (minidnn/fusion.py) as cuda_pointwise's relu_forward computes it
// on the stored value: the bits of the two passes. The launch starts at a pixel boundary and
// C is a multiple of VEC, so a vector's channels are c ... c + VEC - 1. The value is
// computed in T = acc_t<M> and stored once (narrow: rounded once for bf16 maps).
template<typename M, int VEC, bool RELU>
__device__ __forceinline__ void affine_pass(const M* x, M* y, const acc_t<M>* scale,
                                            const acc_t<M>* shift, unsigned int C,
                                            unsigned int c_mul, unsigned int c_shift,
                                            unsigned int n) {
    typedef acc_t<M> T;
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    const unsigned int first = k * VEC;
    const unsigned int c = first - divide(first, c_mul, c_shift) * C;
    Pack<M, VEC> a = load<M, VEC>(x, k);
    #pragma unroll
    for (int j = 0; j < VEC; ++j) {
        const T v = widen(a.v[j]) * scale[c + j] + shift[c + j];
        a.v[j] = narrow<M>(RELU ? (v > (T)0 ? v : (T)0) : v);
    }
    store<M, VEC>(y, k, a);
}

template<typename M, int VEC>
__global__ void bn_affine_last(const M* x, M* y, const acc_t<M>* scale,
                               const acc_t<M>* shift, unsigned int C, unsigned int c_mul,
                               unsigned int c_shift, unsigned int n) {
    affine_pass<M, VEC, false>(x, y, scale, shift, C, c_mul, c_shift, n);
}

template<typename M, int VEC>
__global__ void bn_affine_relu_last(const M* x, M* y, const acc_t<M>* scale,
                                    const acc_t<M>* shift, unsigned int C, unsigned int c_mul,
                                    unsigned int c_shift, unsigned int n) {
    affine_pass<M, VEC, true>(x, y, scale, shift, C, c_mul, c_shift, n);
}

// gx = gy * a[c] + (x - mean[c]) * b[c] + d[c], computed in T, stored once.
template<typename M>
__device__ __forceinline__ M grad_value(M x, M gy, acc_t<M> mean, acc_t<M> a, acc_t<M> b,
                                        acc_t<M> d) {
    return narrow<M>(widen(gy) * a + (widen(x) - mean) * b + d);
}

// Channels last: gx = gy * a[c] + (x - mean[c]) * b[c] + d[c].
template<typename M, int VEC>
__global__ void bn_grad_last(const M* x, const M* gy, M* gx, const acc_t<M>* mean,
                             const acc_t<M>* ca, const acc_t<M>* cb, const acc_t<M>* cd,
                             unsigned int C, unsigned int c_mul, unsigned int c_shift,
                             unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    const unsigned int first = k * VEC;
    const unsigned int c = first - divide(first, c_mul, c_shift) * C;
    const Pack<M, VEC> xv = load<M, VEC>(x, k);
    Pack<M, VEC> g = load<M, VEC>(gy, k);
    #pragma unroll
    for (int j = 0; j < VEC; ++j)
        g.v[j] = grad_value<M>(xv.v[j], g.v[j], mean[c + j], ca[c + j], cb[c + j], cd[c + j]);
    store<M, VEC>(gx, k, g);
}

// NCHW bf16 maps (float32 and float64 ones take the elementwise kernels below): the value i
// lies in channel (i / HW) mod C; a grid-stride loop over the n values.
template<typename M, bool RELU>
__global__ void bn_affine_planes(const M* x, M* y, const acc_t<M>* scale,
                                 const acc_t<M>* shift, int C, long long HW, long long n) {
    typedef acc_t<M> T;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const int c = (int)((i / HW) %% C);
        const T v = widen(x[i]) * scale[c] + shift[c];
        y[i] = narrow<M>(RELU ? (v > (T)0 ? v : (T)0) : v);
    }
}

template<typename M>
__global__ void bn_grad_planes(const M* x, const M* gy, M* gx, const acc_t<M>* mean,
                               const acc_t<M>* ca, const acc_t<M>* cb, const acc_t<M>* cd,
                               int C, long long HW, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const int c = (int)((i / HW) %% C);
        gx[i] = grad_value<M>(x[i], gy[i], mean[c], ca[c], cb[c], cd[c]);
    }
}
""" % {"threads": _THREADS, "part_threads": _PART_THREADS}


def _instances():
    for t in ("float", "double"):            # the per-channel types
        yield f"bn_finish_forward<{t}>"
        yield f"bn_finish_backward<{t}>"
    for t, size in (("float", 4), ("double", 8), ("bf16", 2)):    # the maps' types
        yield f"bn_partial_sums<{t}>"
        yield f"bn_column_partial_sums<{t}>"
        for vec in (1, 16 // size):          # cuda_pointwise's 16-byte vectors
            yield f"bn_affine_last<{t}, {vec}>"
            yield f"bn_affine_relu_last<{t}, {vec}>"
            yield f"bn_grad_last<{t}, {vec}>"
    for relu in ("false", "true"):
        yield f"bn_affine_planes<bf16, {relu}>"
    yield "bn_grad_planes<bf16>"


_module = cp.RawModule(code=_SOURCE, options=("--std=c++14",),
                       name_expressions=list(_instances()))


_scale_shift = cp.ElementwiseKernel(
    "raw T x, raw T scale, raw T shift, int32 C, int64 HW", "T y",
    "const int c = (int)((i / HW) % C); y = x[i] * scale[c] + shift[c];",
    "minidnn_bn_scale_shift")

_grad_input = cp.ElementwiseKernel(
    "raw T x, raw T gy, raw T mean, raw T a, raw T b, raw T c_, int32 C, int64 HW", "T gx",
    "const int c = (int)((i / HW) % C); "
    "gx = gy[i] * a[c] + (x[i] - mean[c]) * b[c] + c_[c];",
    "minidnn_bn_grad_input")


def _ctype_of(x) -> str:
    """The C type of map x: 'float', 'double' or 'bf16'."""
    ctype = map_ctype(x.dtype)
    if ctype is None:
        raise TypeError(f"batch norm kernels take float32, float64 or bfloat16 maps, got "
                        f"{x.dtype}")
    return ctype


def channel_dtype(x):
    """The dtype the per-channel arrays beside map x take, and its values compute in:
    float32 beside bf16 maps, the map's own dtype otherwise."""
    return np.dtype(np.float32) if _ctype_of(x) == "bf16" else np.dtype(x.dtype)


def _channel_ctype(x) -> str:
    return "float" if _ctype_of(x) == "bf16" else _ctype_of(x)


#: Blocks of the grid-stride NCHW bf16 passes (bn_affine_planes, bn_grad_planes).
_PLANE_BLOCKS = 4096


def _planes(name: str, n: int, args: tuple) -> None:
    """A grid-stride NCHW bf16 pass over n values."""
    if n:
        blocks = min(_PLANE_BLOCKS, -(-n // _THREADS))
        _module.get_function(name)((blocks,), (_THREADS,), args + (np.int64(n),))


def _geometry(x, *others) -> tuple:
    """(N, C, H * W, strides of n, c and a pixel in elements) of a map whose pixels are one
    run (NCHW, NHWC); the `others` must be laid out as x."""
    if x.ndim != 4:
        raise ValueError(f"batch norm kernels take (N, C, H, W) maps, got shape {tuple(x.shape)}")
    n, c, h, w = x.shape
    sn, sc, sh, sw = (s // x.itemsize for s in x.strides)
    if (h > 1 and sh != w * sw) or any(o.strides != x.strides or o.shape != x.shape
                                       for o in others):
        raise ValueError(f"batch norm kernels take NCHW or NHWC maps (and the other maps laid "
                         f"out as the input), got strides {x.strides}"
                         f"{''.join(f' and {o.strides}' for o in others)}")
    return n, c, h * w, sn, sc, sw


def _channel_partials(mode: int, geometry: tuple, x, gy, center):
    """(partial, parts): stage one of the per-channel sums of the kernel's `mode`, float64
    (C, parts, 2), for a bn_finish_* kernel to add. geometry: _geometry(x)."""
    n, c, hw, sn, sc, sp = geometry
    ctype = _ctype_of(x)
    unused = x   # the pointer a mode that does not read gy or center is given
    g, m = (gy if gy is not None else unused), (center if center is not None else unused)
    count = n * hw
    if is_channels_last(x) and c > 1:
        blocks_c = -(-c // 32)
        parts = max(1, min(_MAX_PARTS, -(-_TARGET_BLOCKS // blocks_c), -(-count // 64)))
        per_part = -(-count // parts)
        parts = -(-count // per_part)
        partial = cp.empty((c, parts, 2), cp.float64)
        _module.get_function(f"bn_column_partial_sums<{ctype}>")(
            (parts, blocks_c), (32, 8),
            (x, g, m, partial, np.int32(mode), np.int64(count), np.int32(c), np.int64(per_part)))
    else:
        parts = max(1, min(_MAX_PARTS, -(-count // _PER_BLOCK)))
        per_block = -(-count // parts)
        partial = cp.empty((c, parts, 2), cp.float64)
        _module.get_function(f"bn_partial_sums<{ctype}>")(
            (c, parts), (_THREADS,),
            (x, g, m, partial, np.int32(mode), np.int64(hw), np.int64(count),
             np.int64(per_block), np.int64(sn), np.int64(sc), np.int64(sp)))
    return partial, parts


def _statistics(geometry: tuple, x, weight, bias, mean, var, invstd, eps: float,
                running) -> tuple:
    """The batch's mean, var, invstd (C,) into the arrays given, the running estimates moved
    when running = (running_mean, running_var, momentum) is given; returns the affine pass's
    (scale, shift). Two launches."""
    n, c, hw, *_ = geometry
    partial, parts = _channel_partials(0, geometry, x, None, None)
    scale, shift = cp.empty((2, c), channel_dtype(x))   # one allocation: each costs host time
    dt = channel_dtype(x).type
    rm, rv, momentum = running if running is not None else (mean, var, 0.0)
    _module.get_function(f"bn_finish_forward<{_channel_ctype(x)}>")(
        (c,), (_PART_THREADS,),
        (partial, np.int32(parts), np.float64(n * hw), dt(eps), dt(momentum),
         np.int32(running is not None), weight, bias, mean, var, invstd, scale, shift, rm, rv))
    return scale, shift


def _affine(geometry: tuple, x, y, scale, shift, relu: bool = False) -> None:
    """y = x * scale + shift per channel (x, y laid out alike), then max(y, 0) with relu."""
    n, c, hw, *_ = geometry
    if is_channels_last(x):
        run_per_pixel("bn_affine_relu_last" if relu else "bn_affine_last", (x, y),
                      (scale, shift), module=_module)
        return
    if _ctype_of(x) == "bf16":
        _planes(f"bn_affine_planes<bf16, {'true' if relu else 'false'}>", x.size,
                (x, y, scale, shift, np.int32(c), np.int64(hw)))
        return
    _scale_shift(x, scale, shift, c, hw, y)
    if relu:
        relu_forward(y, y)


def batchnorm_stats(x, mean, var) -> None:
    """mean and biased variance of each channel of x (N, C, H, W) into mean, var (C,)."""
    c, dtype = x.shape[1], channel_dtype(x)
    ones, zeros = cp.ones(c, dtype), cp.zeros(c, dtype)
    _statistics(_geometry(x), x, ones, zeros, mean, var, cp.empty(c, dtype), 1.0, None)


def batchnorm_training_forward(x, weight, bias, y, mean, invstd, eps: float,
                               running=None, relu: bool = False) -> None:
    """As cpu_batchnorm.batchnorm_training_forward, in three launches (partial sums, the
    per-channel results, the affine pass, which applies the ReLU with relu)."""
    geometry = _geometry(x, y)
    var = cp.empty(x.shape[1], channel_dtype(x))
    scale, shift = _statistics(geometry, x, weight, bias, mean, var, invstd, eps, running)
    _affine(geometry, x, y, scale, shift, relu)


def batchnorm_forward(x, mean, invstd, weight, bias, y, relu: bool = False) -> None:
    """y = x * scale + shift with scale = invstd * weight, shift = bias - mean * scale; then
    max(y, 0) with relu."""
    scale = invstd * weight
    _affine(_geometry(x, y), x, y, scale, bias - mean * scale, relu)


def batchnorm_backward(x, gy, mean, invstd, weight, gx, gweight, gbias) -> None:
    """Training-mode gradients, as cpu_batchnorm.batchnorm_backward: three launches (partial
    sums, the per-channel results, the per-value pass)."""
    geometry = _geometry(x, gy) if gx is None else _geometry(x, gy, gx)
    n, c, hw, *_ = geometry
    partial, parts = _channel_partials(1, geometry, x, gy, mean)
    a, b, d = cp.empty((3, c), channel_dtype(x))   # one allocation: each costs host time
    _module.get_function(f"bn_finish_backward<{_channel_ctype(x)}>")(
        (c,), (_PART_THREADS,),
        (partial, np.int32(parts), np.float64(n * hw), weight, invstd, gweight, gbias, a, b, d))
    if gx is None:
        return
    if is_channels_last(x):
        run_per_pixel("bn_grad_last", (x, gy, gx), (mean, a, b, d), module=_module)
    elif _ctype_of(x) == "bf16":
        _planes("bn_grad_planes<bf16>", x.size,
                (x, gy, gx, mean, a, b, d, np.int32(c), np.int64(hw)))
    else:
        _grad_input(x, gy, mean, a, b, d, c, hw, gx)
