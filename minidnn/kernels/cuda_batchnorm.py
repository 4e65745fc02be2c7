"""Batch normalization on the GPU: CuPy raw kernels with the signatures of cpu_batchnorm.py.

Two kinds of pass, each at memory speed for both layouts:

* **Per-channel sums** (sum d and sum d^2 of d = x - k in forward, k the channel's first
  value; sum gy and sum gy * (x - mean) in backward), in two stages with no atomics, so the
  same input gives the same bits every time (which is what lets the memory manager recompute
  a batch-norm output in backward exactly). Stage one: a grid of blocks, each adding one
  contiguous part of the rows of some channels and writing its partial sums in double;
  stage two: one block per channel adds its parts in a fixed order. A thread adds a short
  run of values in the maps' compute type (float32 beside bf16 maps: a group's 8 values in
  NCHW, _RUN rows in NHWC), then the run's sum to its totals in double: a conversion and a
  double add per value, as these passes took before, kept them at 45-56% of the H200's
  memory speed (benchmarks/RESULTS.md, wave 19). How a block reads depends on the layout,
  so that a warp reads contiguous bytes, a thread 8 values at a time in 16-byte loads (one
  of bf16, two of float32) where the sizes allow; 8 for every dtype, so that bf16 maps are
  summed in the order of their widened float32 copies:
    NHWC  the map is a (pixels, C) matrix of groups of 8 channels (C a multiple of 8, else
          groups of one); a block of up to 256 threads takes `cols` neighbouring groups of
          a row (all of them when a row has at most 64) and 256 / cols row lanes, so that
          consecutive threads read consecutive groups (a warp: 512 contiguous bytes of
          bf16). Each thread adds every lanes-th row of the block's part for its group's
          channels; each channel's lanes are then added in lane order.
    NCHW  a block takes one channel; its threads stride over the channel's H * W runs, a
          group of 8 neighbouring values each where H * W is a multiple of 8.
  The forward statistics take one pass: mean = k + E[d], var = E[d^2] - E[d]^2 in double;
  k, one of the channel's values, lies within a few standard deviations of the mean, so
  the difference cancels little whatever the mean (float32 sums of x^2 would lose the
  variance of a channel whose mean is large beside its spread).
  The order of the sums follows the geometry alone (the shape, and whether C or H * W and
  the maps' alignment allow groups of 8), never the timing, so a call repeats its bits.
  Against the kernels before these (one value per thread), the order changed, and so did
  the last bits of the statistics and gradients; so did the affine pass's, which no longer
  fuses its multiply and add.
* **Per-value affine maps** y = x * scale[c] + shift[c] and gx = gy * a[c] + (x - mean[c]) *
  b[c] + d[c], one thread per 16-byte vector: in channels last launched by cuda_pointwise's
  run_per_pixel (a vector's first channel is its memory index modulo C, a multiply-high
  division by a launch constant); in NCHW a grid-stride loop over the planes' vectors. The
  per-channel coefficients sit in one array of rows (C,) each, written by the stage-two
  kernel, so a thread loads a vector of them at a time. The affine pass may go on through
  the ReLU after the batch norm, or through the residual add after it and the add's ReLU,
  reading the add's other input z as it reads x (minidnn/fusion.py): max(y + z, 0), y
  rounded to the maps' dtype first, cuda_pointwise.add_relu's bits.

The affine value is x * scale rounded, then + shift rounded (no fused multiply-add; scale =
invstd * weight and shift = bias - mean * scale likewise), NumPy's operations in
cpu_batchnorm: every pass that needs y computes it with these operations, so its bits agree.

Maps (N, C, H, W) in NCHW or channels-last (NHWC) memory, float32, float64 or bfloat16;
per-channel arrays (C,) in the dtype the maps compute in (float32 beside bf16 maps).

bf16 maps (mixed precision, kernels/mapformat.py) are read and written as they are: each
value is widened (exactly) in registers, every sum and product is the float32 kernel's, and
each output is rounded once to bf16 (cuda_pointwise's STORAGE_SOURCE). So a call gives the
bits of the float32 kernels on bf16_to_float of its maps followed by float_to_bf16 of its
outputs, with no float32 map in memory: the sums run in the same order, in the same types,
over the same values.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from .batchnorm_sums import stage_one_parts
from .cuda_divide import DIVIDE_SOURCE
from .cuda_pointwise import ROUNDED_SOURCE, STORAGE_SOURCE, VECTOR_SOURCE, map_ctype, \
    relu_backward, relu_mask_sum, run_per_pixel
from .mapformat import is_channels_last

_THREADS = 256              # threads of a sums block (a power of two) and of a per-value pass
_PART_THREADS = 128         # threads adding one channel's parts (a power of two)
_COLUMNS = 64               # NHWC: most channel groups of a row one sums block reads
#: Channels (NHWC) or values of a plane (NCHW) a thread of a sums pass reads at once: 16
#: bytes of bf16, 32 of float32. The same for every dtype, so that bf16 maps are summed in
#: the order of their widened float32 copies.
_GROUP = 8
_VECTOR_BYTES = 16
#: NHWC sums: rows a thread loads at once and adds in the maps' compute type (float32 beside
#: bf16 maps) before it adds their sums to its float64 totals (a conversion to double and a
#: double add per RUN values instead of per value). The same for every dtype, so that bf16
#: maps are summed in the order of their widened float32 copies.
_RUN = 4
#: The channels-last affine passes, one for each MODE of the kernels' output_value: the
#: affine value; through the ReLU after the batch norm; through the residual add and its ReLU.
_AFFINE_LAST = ("bn_affine_last", "bn_affine_relu_last", "bn_affine_add_relu_last")
#: Blocks of the grid-stride NCHW per-value passes (bn_affine_planes, bn_grad_planes).
_PLANE_BLOCKS = 4096

# mode 0: (x - k, (x - k)^2); mode 1: (gy, gy * (x - mean)); mode 2: as mode 1 with gy first
# masked by the ReLU after the batch norm (minidnn/fusion.py), its output recomputed from x;
# mode 3: as mode 1 of the gradient the residual add after the batch norm hands it, which the
# pass computes from the add's (y, gy, g2) and writes (handed_gradient; fusion.py, bn_sums).
_SOURCE = DIVIDE_SOURCE + VECTOR_SOURCE + STORAGE_SOURCE + ROUNDED_SOURCE + r"""
constexpr int RUN = %(run)d;
// The affine value x * s + t: the product rounded, then the sum (no fused multiply-add), as
// NumPy computes it; every pass that needs a batch norm's output computes it so.
__device__ __forceinline__ float affine(float x, float s, float t) {
    return __fadd_rn(__fmul_rn(x, s), t);
}
__device__ __forceinline__ double affine(double x, double s, double t) {
    return __dadd_rn(__dmul_rn(x, s), t);
}

// A gradient value g * a + centred * b + d, each operation rounded on its own in NumPy's order
// (cpu_batchnorm.batchnorm_backward): no fused multiply-add, which the compiler would place
// differently in the kernels with and without the folded ReLU, whose bits must agree.
__device__ __forceinline__ float gradient(float g, float a, float centred, float b, float d) {
    return __fadd_rn(__fadd_rn(__fmul_rn(g, a), __fmul_rn(centred, b)), d);
}
__device__ __forceinline__ double gradient(double g, double a, double centred, double b,
                                           double d) {
    return __dadd_rn(__dadd_rn(__dmul_rn(g, a), __dmul_rn(centred, b)), d);
}

// scale = invstd * weight, shift = bias - mean * scale, each operation rounded on its own.
__device__ __forceinline__ void scale_shift(float inv, float w, float b, float m, float& s,
                                            float& t) {
    s = __fmul_rn(inv, w);
    t = __fsub_rn(b, __fmul_rn(m, s));
}
__device__ __forceinline__ void scale_shift(double inv, double w, double b, double m,
                                            double& s, double& t) {
    s = __dmul_rn(inv, w);
    t = __dsub_rn(b, __dmul_rn(m, s));
}

// Did the ReLU after the batch norm pass its gradient? Its output, stored as M, is > 0: the
// test of cuda_pointwise's relu_backward on that output. For float and double that is v > 0.
// A positive v too small for bf16 is stored as 0 and passes nothing: bf16 rounds to zero
// exactly the floats at most 2^-134 (bits 0x8000, the tie, rounds to the even 0), so one
// comparison answers without rounding v (the same answers, fewer instructions in the passes
// that ask it for every value: benchmarks/RESULTS.md, wave 20).
template<typename M>
__device__ __forceinline__ bool relu_passes(acc_t<M> v) {
    return v > (acc_t<M>)0;
}
template<>
__device__ __forceinline__ bool relu_passes<bf16>(float v) {
    return v > __uint_as_float(0x8000u);
}

// G values of M at p (16-byte aligned when G > 1) into v, in 16-byte loads.
template<typename M, int G>
__device__ __forceinline__ void load_group(const M* p, M (&v)[G]) {
    constexpr int V = (int)(16 / sizeof(M)) < G ? (int)(16 / sizeof(M)) : G;
    #pragma unroll
    for (int i = 0; i < G / V; ++i) {
        const Pack<M, V> a = reinterpret_cast<const Pack<M, V>*>(p)[i];
        #pragma unroll
        for (int j = 0; j < V; ++j) v[i * V + j] = a.v[j];
    }
}

// G values of M from v to p (16-byte aligned when G > 1), in 16-byte stores.
template<typename M, int G>
__device__ __forceinline__ void store_group(M* p, const M (&v)[G]) {
    constexpr int V = (int)(16 / sizeof(M)) < G ? (int)(16 / sizeof(M)) : G;
    #pragma unroll
    for (int i = 0; i < G / V; ++i) {
        Pack<M, V> a;
        #pragma unroll
        for (int j = 0; j < V; ++j) a.v[j] = v[i * V + j];
        reinterpret_cast<Pack<M, V>*>(p)[i] = a;
    }
}

// Mode 3: the gradient the residual add after the batch norm (with its ReLU) hands it, made
// from the G values of the add's output gradient at offset o (g, loaded) as the add's backward
// makes it (cuda_pointwise's masked_sum, or its relu_backward when g2 is null): g + g2 stored
// as the add stores a sum, kept where the add's output y > 0, else 0; written to `out` and
// left in g for the sums.
template<typename M, int G>
__device__ __forceinline__ void handed_gradient(const M* y, const M* g2, M* out, long long o,
                                                M (&g)[G]) {
    M yv[G], hv[G];
    load_group<M, G>(y + o, yv);
    if (g2 != nullptr) load_group<M, G>(g2 + o, hv);
    #pragma unroll
    for (int j = 0; j < G; ++j) {
        const M v = g2 != nullptr ? narrow<M>(widen(g[j]) + widen(hv[j])) : g[j];
        g[j] = widen(yv[j]) > 0 ? v : narrow<M>((acc_t<M>)0);
    }
    store_group<M, G>(out + o, g);
}

// One value's terms of the sums of MODE (see _SOURCE's comment), added to a run's sums
// (a, b) in T = acc_t<M>: mode 0 (d, d * d) with d = x - m, m the channel's shift; modes 1
// and 2 (g, g * (x - m)), m the mean. s, t: the affine's coefficients (mode 2).
template<typename M, int MODE>
__device__ __forceinline__ void accumulate(M x, M g, acc_t<M> m, acc_t<M> s, acc_t<M> t,
                                           acc_t<M>& a, acc_t<M>& b) {
    typedef acc_t<M> T;
    const T xv = widen(x);
    if (MODE == 0) {
        const T d = sub(xv, m);
        a = add(a, d);
        b = add(b, mul(d, d));
    } else {
        T gv = widen(g);
        if (MODE == 2 && !relu_passes<M>(affine(xv, s, t))) gv = (T)0;
        a = add(a, gv);
        b = add(b, mul(gv, sub(xv, m)));
    }
}

// The per-channel values a sums pass of MODE needs for channel c: m, the channel's shift
// (mode 0: its first value, x[first], so that the sums of x - m cancel nothing: see
// bn_finish_forward) or its mean (modes 1, 2); the affine's scale and shift (mode 2), from
// the forward's mean, invstd, weight and bias.
template<typename M, int MODE>
__device__ __forceinline__ void channel_terms(const M* x, long long first,
                                              const acc_t<M>* mean, const acc_t<M>* invstd,
                                              const acc_t<M>* weight, const acc_t<M>* bias,
                                              int c, acc_t<M>& m, acc_t<M>& s, acc_t<M>& t) {
    typedef acc_t<M> T;
    m = MODE == 0 ? widen(x[first]) : mean[c];
    s = (T)0;
    t = (T)0;
    if (MODE == 2) scale_shift(invstd[c], weight[c], bias[c], m, s, t);
}

// A run's sums (a, b), in T, added to the thread's totals in double.
template<typename T>
__device__ __forceinline__ void flush(T& a, T& b, double& ta, double& tb) {
    ta = add(ta, (double)a);
    tb = add(tb, (double)b);
    a = (T)0;
    b = (T)0;
}

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

// NCHW (or any map whose pixels are one run): block (c, part) adds part `part` of channel
// c's groups of G values (G > 1: H * W a multiple of G, pixels contiguous, 16-byte aligned
// planes), a group's values in order, in T = acc_t<M> (the per-channel arrays' type), each
// group's sums then to the thread's totals in double.
template<typename M, int G, int MODE>
__global__ void bn_partial_sums(const M* __restrict__ x, const M* __restrict__ gy,
                                const acc_t<M>* mean, const acc_t<M>* invstd,
                                const acc_t<M>* weight, const acc_t<M>* bias, double* partial,
                                long long groups_per_plane, long long groups,
                                long long per_block, long long stride_n, long long stride_c,
                                long long stride_p, const M* __restrict__ y,
                                const M* __restrict__ g2, M* __restrict__ out) {
    typedef acc_t<M> T;
    const int c = blockIdx.x, part = blockIdx.y, parts = gridDim.y;
    const long long begin = (long long)part * per_block;
    const long long end = min(groups, begin + per_block);
    T m, s, t;
    channel_terms<M, MODE>(x, c * stride_c, mean, invstd, weight, bias, c, m, s, t);
    double a = 0, b = 0;
    T ra = 0, rb = 0;
    for (long long k = begin + threadIdx.x; k < end; k += blockDim.x) {
        const long long n = k / groups_per_plane, p = (k - n * groups_per_plane) * G;
        const long long o = n * stride_n + c * stride_c + p * stride_p;
        M xv[G], gv[G];
        load_group<M, G>(x + o, xv);
        if (MODE != 0) load_group<M, G>(gy + o, gv);
        if (MODE == 3) handed_gradient<M, G>(y, g2, out, o, gv);
        #pragma unroll
        for (int j = 0; j < G; ++j)
            accumulate<M, MODE>(xv[j], MODE ? gv[j] : xv[j], m, s, t, ra, rb);
        flush(ra, rb, a, b);
    }
    __shared__ double sa[%(threads)d], sb[%(threads)d];
    block_sums(sa, sb, a, b);
    if (threadIdx.x == 0) {
        partial[2 * ((long long)c * parts + part)] = a;
        partial[2 * ((long long)c * parts + part) + 1] = b;
    }
}

// NHWC: x is (rows, C), seen as rows of C / G groups of G channels (G > 1: C a multiple of G,
// 16-byte aligned maps). Block (part, j) takes the `cols` groups j * cols ... of rows
// [part * per_part, ...); thread t takes group column t %% cols and row lane t / cols, and
// adds every lanes-th row from its lane (neighbouring threads read neighbouring 16 bytes),
// RUN rows at a time in T = acc_t<M>, each run's sums then to its totals in double; then
// each channel's lanes are added in lane order. blockDim.x = cols * lanes <= 256.
template<typename M, int G, int MODE>
__global__ void bn_column_partial_sums(const M* __restrict__ x, const M* __restrict__ gy,
                                       const acc_t<M>* mean, const acc_t<M>* invstd,
                                       const acc_t<M>* weight, const acc_t<M>* bias,
                                       double* partial, long long rows, int C,
                                       long long per_part, int cols, int lanes,
                                       const M* __restrict__ y, const M* __restrict__ g2,
                                       M* __restrict__ out) {
    typedef acc_t<M> T;
    const int tid = threadIdx.x, lane = tid / cols, col = tid - lane * cols;
    const int group = blockIdx.y * cols + col, part = blockIdx.x, parts = gridDim.x;
    const long long r0 = (long long)part * per_part;
    const long long r1 = min(rows, r0 + per_part);
    // The thread's totals, sums[2j + k][thread], in shared memory rather than registers
    // (which then hold more loads in flight); a warp reads and writes neighbouring doubles.
    __shared__ double sums[2 * G][%(threads)d];
    #pragma unroll
    for (int j = 0; j < G; ++j) { sums[2 * j][tid] = 0; sums[2 * j + 1][tid] = 0; }
    if (group * G < C) {
        T m[G], s[G], t[G], ra[G], rb[G];
        #pragma unroll
        for (int j = 0; j < G; ++j) {
            channel_terms<M, MODE>(x, group * G + j, mean, invstd, weight, bias, group * G + j,
                                   m[j], s[j], t[j]);
            ra[j] = 0;
            rb[j] = 0;
        }
        // Whole runs: a run's RUN rows are all loaded before any is added, so that their
        // loads are in flight together (a guard on each row would serialize them).
        long long r = r0 + lane;
        for (; r + (long long)(RUN - 1) * lanes < r1; r += (long long)RUN * lanes) {
            M xv[RUN][G], gv[RUN][G];
            #pragma unroll
            for (int q = 0; q < RUN; ++q) {
                const long long o = (r + (long long)q * lanes) * C + group * G;
                load_group<M, G>(x + o, xv[q]);
                if (MODE != 0) load_group<M, G>(gy + o, gv[q]);
                if (MODE == 3) handed_gradient<M, G>(y, g2, out, o, gv[q]);
            }
            #pragma unroll
            for (int q = 0; q < RUN; ++q) {
                #pragma unroll
                for (int j = 0; j < G; ++j)
                    accumulate<M, MODE>(xv[q][j], MODE ? gv[q][j] : xv[q][j], m[j], s[j], t[j],
                                        ra[j], rb[j]);
            }
            #pragma unroll
            for (int j = 0; j < G; ++j)
                flush(ra[j], rb[j], sums[2 * j][tid], sums[2 * j + 1][tid]);
        }
        for (; r < r1; r += lanes) {          // the rows left, fewer than RUN: one more run
            const long long o = r * C + group * G;
            M xv[G], gv[G];
            load_group<M, G>(x + o, xv);
            if (MODE != 0) load_group<M, G>(gy + o, gv);
            if (MODE == 3) handed_gradient<M, G>(y, g2, out, o, gv);
            #pragma unroll
            for (int j = 0; j < G; ++j)
                accumulate<M, MODE>(xv[j], MODE ? gv[j] : xv[j], m[j], s[j], t[j], ra[j], rb[j]);
        }
        #pragma unroll
        for (int j = 0; j < G; ++j)
            flush(ra[j], rb[j], sums[2 * j][tid], sums[2 * j + 1][tid]);
    }
    __syncthreads();
    for (int u = tid; u < 2 * G * cols; u += blockDim.x) {
        const int k = u / cols, cc = u - k * cols, ch = (blockIdx.y * cols + cc) * G + k / 2;
        if (ch >= C) continue;
        double total = 0;
        for (int l = 0; l < lanes; ++l) total += sums[k][l * cols + cc];
        partial[2 * ((long long)ch * parts + part) + (k & 1)] = total;
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

// Forward: from the sums of d = x - k and of d^2, k = x[c * stride_c] the channel's shift
// (its first value): mean = k + E[d], var (biased) = E[d^2] - E[d]^2, in double, which
// cancels little since k is one of the channel's values (E[x^2] - mean^2 would lose what
// float sums cannot hold when |mean| is many times the standard deviation); invstd =
// 1 / sqrt(var + eps), and the affine pass's coefficients coef = [scale (C), shift (C)];
// with update != 0 the running estimates move: r = (1 - momentum) * r + momentum * batch
// value (var unbiased). T = acc_t<M>.
template<typename M>
__global__ void bn_finish_forward(const double* partial, int parts, double count, const M* x,
                                  long long stride_c, acc_t<M> eps, acc_t<M> momentum,
                                  int update, const acc_t<M>* weight, const acc_t<M>* bias,
                                  acc_t<M>* mean, acc_t<M>* var, acc_t<M>* invstd,
                                  acc_t<M>* coef, acc_t<M>* running_mean,
                                  acc_t<M>* running_var, int C) {
    typedef acc_t<M> T;
    double total, squares;
    sum_parts(partial, parts, total, squares);
    if (threadIdx.x != 0) return;
    const int c = blockIdx.x;
    const double d = total / count;
    const double m = (double)widen(x[c * stride_c]) + d;
    const T mt = (T)m, vt = (T)fmax(squares / count - d * d, 0.0);
    const T inv = (T)1 / sqrt(vt + eps);
    mean[c] = mt;
    var[c] = vt;
    invstd[c] = inv;
    scale_shift(inv, weight[c], bias[c], mt, coef[c], coef[C + c]);
    if (update) {
        const T keep = (T)1 - momentum;
        running_mean[c] = running_mean[c] * keep + momentum * mt;
        running_var[c] = running_var[c] * keep + (momentum * (T)(count / (count - 1))) * vt;
    }
}

// Backward: from (sum gy, sum gy * (x - mean)): gbias, gweight, and the per-value pass's
// coefficients coef = [mean, a, b, d, scale, shift] (C each), gx = gy * a + (x - mean) * b + d
// (cpu_batchnorm.batchnorm_backward); and with relu the forward's scale and shift.
template<typename T>
__global__ void bn_finish_backward(const double* partial, int parts, double count,
                                   const T* mean, const T* weight, const T* invstd,
                                   const T* bias, int relu, T* gweight, T* gbias, T* coef,
                                   int C) {
    double sum_gy, sum_gy_centred;
    sum_parts(partial, parts, sum_gy, sum_gy_centred);
    if (threadIdx.x != 0) return;
    const int c = blockIdx.x;
    const double istd = (double)invstd[c];
    const double a = (double)weight[c] * istd;
    gbias[c] = (T)sum_gy;
    gweight[c] = (T)(sum_gy_centred * istd);
    coef[c] = mean[c];
    coef[C + c] = (T)a;
    coef[2 * C + c] = (T)(-a * istd * istd * sum_gy_centred / count);
    coef[3 * C + c] = (T)(-a * sum_gy / count);
    if (relu) scale_shift(invstd[c], weight[c], bias[c], mean[c], coef[4 * C + c],
                          coef[5 * C + c]);
}

// y = x * scale + shift (coef = [scale, shift]), then with RELU the ReLU after the batch
// norm as cuda_pointwise's relu_forward computes it on the stored value: the bits of the two
// passes. The value is computed in T = acc_t<M> and stored once (rounded once for bf16).
template<typename M, bool RELU>
__device__ __forceinline__ M affine_value(M x, acc_t<M> s, acc_t<M> t) {
    typedef acc_t<M> T;
    const T v = affine(widen(x), s, t);
    return narrow<M>(RELU ? (v > (T)0 ? v : (T)0) : v);
}

// The affine pass's output in MODE: 0 the affine value; 1 through the ReLU after the batch
// norm; 2 through the residual add after it and its ReLU (minidnn/fusion.py): the affine
// value stored as the batch norm stores it, then cuda_pointwise's add_relu on it and z.
template<typename M, int MODE>
__device__ __forceinline__ M output_value(M x, M z, acc_t<M> s, acc_t<M> t) {
    if (MODE != 2) return affine_value<M, MODE == 1>(x, s, t);
    const M stored = affine_value<M, false>(x, s, t);
    const M sum = narrow<M>(widen(stored) + widen(z));
    return widen(sum) > 0 ? sum : narrow<M>(0);
}

// gx for gy, x of channel coefficients (mean, a, b, d, scale, shift) in MODE: 0 the batch
// norm's gradient; 1 the same of gy masked by the ReLU after it; 2 that masked gy alone.
template<typename M, int MODE>
__device__ __forceinline__ M grad_value(M x, M gy, acc_t<M> m, acc_t<M> a, acc_t<M> b,
                                        acc_t<M> d, acc_t<M> s, acc_t<M> t) {
    typedef acc_t<M> T;
    const T xv = widen(x);
    const bool pass = MODE == 0 || relu_passes<M>(affine(xv, s, t));
    if (MODE == 2) return pass ? gy : narrow<M>((T)0);
    const T g = pass ? widen(gy) : (T)0;
    return narrow<M>(gradient(g, a, xv - m, b, d));
}

// Channels last, (pixels, C) in memory: the launch starts at a pixel boundary and C is a
// multiple of VEC, so a vector's channels are c ... c + VEC - 1, and its coefficients a
// vector of each row of coef (16-byte aligned rows when VEC > 1). z: read in MODE 2 only.
template<typename M, int VEC, int MODE>
__device__ __forceinline__ void affine_pass(const M* x, const M* z, M* y,
                                            const acc_t<M>* coef, unsigned int C,
                                            unsigned int c_mul, unsigned int c_shift,
                                            unsigned int n) {
    typedef acc_t<M> T;
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    const unsigned int first = k * VEC;
    const unsigned int v = (first - divide(first, c_mul, c_shift) * C) / VEC;
    const Pack<T, VEC> s = load<T, VEC>(coef, v), t = load<T, VEC>(coef + C, v);
    Pack<M, VEC> a = load<M, VEC>(x, k);
    const Pack<M, VEC> r = MODE == 2 ? load<M, VEC>(z, k) : a;
    #pragma unroll
    for (int j = 0; j < VEC; ++j) a.v[j] = output_value<M, MODE>(a.v[j], r.v[j], s.v[j], t.v[j]);
    store<M, VEC>(y, k, a);
}

// The three affine passes of channels-last maps, one for each MODE of output_value.
template<typename M, int VEC>
__global__ void bn_affine_last(const M* x, const M* z, M* y, const acc_t<M>* coef,
                               unsigned int C, unsigned int c_mul, unsigned int c_shift,
                               unsigned int n) {
    affine_pass<M, VEC, 0>(x, z, y, coef, C, c_mul, c_shift, n);
}

template<typename M, int VEC>
__global__ void bn_affine_relu_last(const M* x, const M* z, M* y, const acc_t<M>* coef,
                                    unsigned int C, unsigned int c_mul, unsigned int c_shift,
                                    unsigned int n) {
    affine_pass<M, VEC, 1>(x, z, y, coef, C, c_mul, c_shift, n);
}

template<typename M, int VEC>
__global__ void bn_affine_add_relu_last(const M* x, const M* z, M* y, const acc_t<M>* coef,
                                        unsigned int C, unsigned int c_mul,
                                        unsigned int c_shift, unsigned int n) {
    affine_pass<M, VEC, 2>(x, z, y, coef, C, c_mul, c_shift, n);
}

// Channels last: gx from x, gy and coef = [mean, a, b, d, scale, shift] in MODE (grad_value).
template<typename M, int VEC, int MODE>
__device__ __forceinline__ void grad_pass(const M* x, const M* gy, M* gx,
                                          const acc_t<M>* coef, unsigned int C,
                                          unsigned int c_mul, unsigned int c_shift,
                                          unsigned int n) {
    typedef acc_t<M> T;
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    const unsigned int first = k * VEC;
    const unsigned int v = (first - divide(first, c_mul, c_shift) * C) / VEC;
    Pack<T, VEC> m, a, b, d, s, t;
    if (MODE != 2) {
        m = load<T, VEC>(coef, v);
        a = load<T, VEC>(coef + C, v);
        b = load<T, VEC>(coef + 2 * C, v);
        d = load<T, VEC>(coef + 3 * C, v);
    }
    if (MODE != 0) {
        s = load<T, VEC>(coef + 4 * C, v);
        t = load<T, VEC>(coef + 5 * C, v);
    }
    const Pack<M, VEC> xv = load<M, VEC>(x, k);
    Pack<M, VEC> g = load<M, VEC>(gy, k);
    #pragma unroll
    for (int j = 0; j < VEC; ++j)
        g.v[j] = grad_value<M, MODE>(xv.v[j], g.v[j], MODE != 2 ? m.v[j] : (T)0,
                                     MODE != 2 ? a.v[j] : (T)0, MODE != 2 ? b.v[j] : (T)0,
                                     MODE != 2 ? d.v[j] : (T)0, MODE ? s.v[j] : (T)0,
                                     MODE ? t.v[j] : (T)0);
    store<M, VEC>(gx, k, g);
}

template<typename M, int VEC>
__global__ void bn_grad_last(const M* x, const M* gy, M* gx, const acc_t<M>* coef,
                             unsigned int C, unsigned int c_mul, unsigned int c_shift,
                             unsigned int n) {
    grad_pass<M, VEC, 0>(x, gy, gx, coef, C, c_mul, c_shift, n);
}

template<typename M, int VEC>
__global__ void bn_grad_relu_last(const M* x, const M* gy, M* gx, const acc_t<M>* coef,
                                  unsigned int C, unsigned int c_mul, unsigned int c_shift,
                                  unsigned int n) {
    grad_pass<M, VEC, 1>(x, gy, gx, coef, C, c_mul, c_shift, n);
}

template<typename M, int VEC>
__global__ void bn_relu_mask_last(const M* x, const M* gy, M* gx, const acc_t<M>* coef,
                                  unsigned int C, unsigned int c_mul, unsigned int c_shift,
                                  unsigned int n) {
    grad_pass<M, VEC, 2>(x, gy, gx, coef, C, c_mul, c_shift, n);
}

// NCHW: planes of HW values (plane p has channel p %% C), VEC values a thread per step of a
// grid-stride loop (HW a multiple of VEC, 16-byte aligned maps when VEC > 1); the output in
// MODE (output_value), z read in MODE 2 only.
template<typename M, int VEC, int MODE>
__global__ void bn_affine_planes(const M* x, const M* z, M* y, const acc_t<M>* coef, int C,
                                 long long HW, long long n) {
    typedef acc_t<M> T;
    const long long vectors = n / VEC;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < vectors;
         i += (long long)gridDim.x * blockDim.x) {
        const int c = (int)((i * VEC / HW) %% C);
        const T s = coef[c], t = coef[C + c];
        Pack<M, VEC> a = load<M, VEC>(x + i * VEC, 0);
        const Pack<M, VEC> r = MODE == 2 ? load<M, VEC>(z + i * VEC, 0) : a;
        #pragma unroll
        for (int j = 0; j < VEC; ++j) a.v[j] = output_value<M, MODE>(a.v[j], r.v[j], s, t);
        store<M, VEC>(y + i * VEC, 0, a);
    }
}

template<typename M, int VEC, int MODE>
__global__ void bn_grad_planes(const M* x, const M* gy, M* gx, const acc_t<M>* coef, int C,
                               long long HW, long long n) {
    typedef acc_t<M> T;
    const long long vectors = n / VEC;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < vectors;
         i += (long long)gridDim.x * blockDim.x) {
        const int c = (int)((i * VEC / HW) %% C);
        const T m = MODE != 2 ? coef[c] : (T)0, a = MODE != 2 ? coef[C + c] : (T)0;
        const T b = MODE != 2 ? coef[2 * C + c] : (T)0, d = MODE != 2 ? coef[3 * C + c] : (T)0;
        const T s = MODE ? coef[4 * C + c] : (T)0, t = MODE ? coef[5 * C + c] : (T)0;
        const Pack<M, VEC> xv = load<M, VEC>(x + i * VEC, 0);
        Pack<M, VEC> g = load<M, VEC>(gy + i * VEC, 0);
        #pragma unroll
        for (int j = 0; j < VEC; ++j)
            g.v[j] = grad_value<M, MODE>(xv.v[j], g.v[j], m, a, b, d, s, t);
        store<M, VEC>(gx + i * VEC, 0, g);
    }
}
""" % {"threads": _THREADS, "part_threads": _PART_THREADS, "run": _RUN}


def _instances():
    for t in ("float", "double"):            # the per-channel types
        yield f"bn_finish_backward<{t}>"
    for t, size in (("float", 4), ("double", 8), ("bf16", 2)):    # the maps' types
        yield f"bn_finish_forward<{t}>"
        for group in (1, _GROUP):
            for mode in (0, 1, 2, 3):
                yield f"bn_partial_sums<{t}, {group}, {mode}>"
                yield f"bn_column_partial_sums<{t}, {group}, {mode}>"
        for vec in (1, 16 // size):          # cuda_pointwise's 16-byte vectors
            for name in _AFFINE_LAST + ("bn_grad_last", "bn_grad_relu_last",
                                        "bn_relu_mask_last"):
                yield f"{name}<{t}, {vec}>"
            for mode in (0, 1, 2):
                yield f"bn_affine_planes<{t}, {vec}, {mode}>"
            for mode in (0, 1, 2):
                yield f"bn_grad_planes<{t}, {vec}, {mode}>"


_module = cp.RawModule(code=_SOURCE, options=("--std=c++14",),
                       name_expressions=list(_instances()))


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


def _aligned(*arrays) -> bool:
    """Do all the arrays start on a 16-byte boundary (for the vector loads)?"""
    return all(a.data.ptr % _VECTOR_BYTES == 0 for a in arrays)


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


def _column_shape(c: int, group: int) -> tuple:
    """(cols, lanes) of a channels-last sums block: `cols` neighbouring groups of a row (all
    of a row's, up to _COLUMNS: wide rows are split over blocks, which keeps enough blocks)
    and _THREADS // cols row lanes."""
    cols = min(-(-c // group), _COLUMNS)
    return cols, _THREADS // cols


def _group(x, gy, handed, size: int) -> int:
    """Values a thread of a sums pass reads at once: _GROUP where `size` (C channels last,
    H * W in NCHW) is a multiple of it and the maps summed are aligned, else 1: x and gy,
    or in mode 3 (handed = (y, g2, out)) x and out, the maps mode 1 sums after the add's
    pass, so that mode 3 sums in mode 1's order; its other maps (gy, y, g2) must then be
    aligned too (ValueError: handed_sums makes the gradient apart)."""
    summed, others = ((x, gy), ()) if not handed else ((x, handed[2]), (gy,) + handed[:2])
    group = _GROUP if size % _GROUP == 0 and \
        _aligned(*(a for a in summed if a is not None)) else 1
    if group > 1 and not _aligned(*(a for a in others if a is not None)):
        raise ValueError("the add's maps are not aligned as the batch norm's are")
    return group


def _channel_partials(mode: int, geometry: tuple, x, gy=None, channel=None, handed=()):
    """(partial, parts): stage one of the per-channel sums of the kernel's `mode` (0: forward;
    1: backward; 2: backward through the ReLU after the batch norm; 3: backward of the
    gradient an add hands on, which the pass writes), float64 (C, parts, 2), for a
    bn_finish_* kernel to add. geometry: _geometry(x); channel: (mean, invstd, weight, bias)
    (C,) for modes 1 to 3 (modes 1 and 3 read only the mean); handed: mode 3's (y, g2, out),
    the add's output, its gradient's second part (None: none) and the gradient written."""
    n, c, hw, sn, sc, sp = geometry
    ctype = _ctype_of(x)
    g = gy if gy is not None else x      # the pointer a mode that does not read gy is given
    per_channel = channel if channel is not None else (x,) * 4   # (not read in mode 0)
    y, g2, out = handed if handed else (x, None, x)    # (read and written in mode 3 only)
    tail = (y, np.uint64(0) if g2 is None else g2, out)       # 0: a null pointer
    count = n * hw
    if is_channels_last(x) and c > 1:
        group = _group(x, gy, handed, c)
        cols, lanes = _column_shape(c, group)
        blocks_c = -(-c // (group * cols))
        parts = stage_one_parts(count, c, blocks_c)
        per_part = -(-count // parts)
        parts = -(-count // per_part)
        partial = cp.empty((c, parts, 2), cp.float64)
        _module.get_function(f"bn_column_partial_sums<{ctype}, {group}, {mode}>")(
            (parts, blocks_c), (cols * lanes,),
            (x, g, *per_channel, partial, np.int64(count), np.int32(c), np.int64(per_part),
             np.int32(cols), np.int32(lanes), *tail))
    else:
        group = _group(x, gy, handed, hw) if sp == 1 else 1
        groups = count // group
        parts = stage_one_parts(count, c)
        per_block = -(-groups // parts)
        parts = -(-groups // per_block)
        partial = cp.empty((c, parts, 2), cp.float64)
        _module.get_function(f"bn_partial_sums<{ctype}, {group}, {mode}>")(
            (c, parts), (_THREADS,),
            (x, g, *per_channel, partial, np.int64(hw // group), np.int64(groups),
             np.int64(per_block), np.int64(sn), np.int64(sc), np.int64(sp), *tail))
    return partial, parts


def _statistics(geometry: tuple, x, weight, bias, mean, var, invstd, eps: float,
                running):
    """The batch's mean, var, invstd (C,) into the arrays given, the running estimates moved
    when running = (running_mean, running_var, momentum) is given; returns the affine pass's
    coefficients (2, C): scale, shift. Two launches."""
    n, c, hw, _, sc, _ = geometry        # sc: a channel's first value is x[c * sc]
    partial, parts = _channel_partials(0, geometry, x)
    coef = cp.empty((2, c), channel_dtype(x))   # one allocation: each costs host time
    dt = channel_dtype(x).type
    rm, rv, momentum = running if running is not None else (mean, var, 0.0)
    _module.get_function(f"bn_finish_forward<{_ctype_of(x)}>")(
        (c,), (_PART_THREADS,),
        (partial, np.int32(parts), np.float64(n * hw), x, np.int64(sc), dt(eps), dt(momentum),
         np.int32(running is not None), weight, bias, mean, var, invstd, coef, rm, rv,
         np.int32(c)))
    return coef


def _per_value(last: str, planes: tuple, geometry: tuple, maps, coef) -> None:
    """A per-value pass over `maps` (laid out alike) with the per-channel coefficients coef
    (rows of C values): kernel `last` in channels last, else bn_..._planes<T, VEC, `planes`>
    (its name given up to the template arguments, e.g. 'bn_grad_planes' and '1')."""
    n, c, hw, *_ = geometry
    x = maps[0]
    if is_channels_last(x):
        run_per_pixel(last, maps, (coef,), module=_module)
        return
    kernel, arguments = planes
    if not x.size:
        return
    vec = _VECTOR_BYTES // x.itemsize
    if hw % vec or not _aligned(*maps):
        vec = 1
    blocks = min(_PLANE_BLOCKS, -(-x.size // vec // _THREADS))
    _module.get_function(f"{kernel}<{_ctype_of(x)}, {vec}, {arguments}>")(
        (blocks,), (_THREADS,), (*maps, coef, np.int32(c), np.int64(hw), np.int64(x.size)))


def _affine(geometry: tuple, x, y, coef, relu: bool = False, residual=None) -> None:
    """y = x * scale + shift per channel (coef = [scale, shift]; x, y laid out alike), then
    max(y, 0) with relu; with residual = (z, stored), max(y + z, 0), y rounded to the maps'
    dtype first (the kernels read and write the maps as they are: `stored` is theirs)."""
    mode = 2 if residual is not None else int(relu)     # output_value's MODE
    z = x if residual is None else residual[0]            # read in mode 2 only
    _per_value(_AFFINE_LAST[mode], ("bn_affine_planes", str(mode)), geometry, (x, z, y), coef)


def batchnorm_stats(x, mean, var) -> None:
    """mean and biased variance of each channel of x (N, C, H, W) into mean, var (C,)."""
    c, dtype = x.shape[1], channel_dtype(x)
    ones, zeros = cp.ones(c, dtype), cp.zeros(c, dtype)
    _statistics(_geometry(x), x, ones, zeros, mean, var, cp.empty(c, dtype), 1.0, None)


def batchnorm_training_forward(x, weight, bias, y, mean, invstd, eps: float,
                               running=None, relu: bool = False, residual=None) -> None:
    """As cpu_batchnorm.batchnorm_training_forward, in three launches (partial sums, the
    per-channel results, the affine pass, which applies the ReLU with relu, the add and its
    ReLU with residual)."""
    geometry = _geometry(x, y) if residual is None else _geometry(x, y, residual[0])
    var = cp.empty(x.shape[1], channel_dtype(x))
    coef = _statistics(geometry, x, weight, bias, mean, var, invstd, eps, running)
    _affine(geometry, x, y, coef, relu, residual)


def _forward_coefficients(mean, invstd, weight, bias):
    """(2, C): scale = invstd * weight, shift = bias - mean * scale, each operation rounded
    on its own (as bn_finish_forward's scale_shift)."""
    coef = cp.empty((2,) + tuple(mean.shape), mean.dtype)
    cp.multiply(invstd, weight, out=coef[0])
    cp.multiply(mean, coef[0], out=coef[1])
    cp.subtract(bias, coef[1], out=coef[1])
    return coef


def batchnorm_forward(x, mean, invstd, weight, bias, y, relu: bool = False,
                      residual=None) -> None:
    """y = x * scale + shift with scale = invstd * weight, shift = bias - mean * scale; then
    max(y, 0) with relu, max(y + z, 0) with residual = (z, stored) (as _affine)."""
    geometry = _geometry(x, y) if residual is None else _geometry(x, y, residual[0])
    _affine(geometry, x, y, _forward_coefficients(mean, invstd, weight, bias), relu,
            residual)


def handed_sums(y, gy, g2, gx, x, mean):
    """The backward of a residual add with the ReLU after it, writing its gradient to gx
    alone (cuda_pointwise.relu_mask_sum, or relu_backward when g2 is None), and in the same
    pass the per-channel sums that the backward of the batch norm whose input is x and
    output gradient gx needs (minidnn/fusion.py, bn_sums): mode 3 of the sums kernels, in
    mode 1's order, so batchnorm_backward(..., sums=) gives the bits it gives without them.

    Args:
        y, gy, g2, gx: the add's output (the ReLU's), its output gradient, the second part of
            that gradient it adds (or None), the gradient written (N, C, H, W), laid out as x;
            gx may be gy (in place: a thread reads each of its values before it writes it).
        x: the batch norm's input (N, C, H, W); mean: its batch mean (C,).
    Returns:
        (partial, parts): stage one's sums, for batchnorm_backward's `sums`.
    """
    maps = (x, gy, gx, y) + (() if g2 is None else (g2,))
    geometry = _geometry(*maps)
    if gx.data.ptr in (y.data.ptr, x.data.ptr) or g2 is not None and gx.data.ptr == g2.data.ptr:
        raise ValueError("handed_sums writes its gradient over a map it reads besides gy")
    try:
        return _channel_partials(3, geometry, x, gy, (mean,) * 4, handed=(y, g2, gx))
    except ValueError:      # maps aligned apart: the add's pass, then the sums of its output
        if g2 is None:
            relu_backward(y, gy, gx)
        else:
            relu_mask_sum(y, gy, g2, gx)
        return _channel_partials(1, geometry, x, gx, (mean,) * 4)


def batchnorm_backward(x, gy, mean, invstd, weight, gx, gweight, gbias, relu=None,
                       sums=None) -> None:
    """Training-mode gradients, as cpu_batchnorm.batchnorm_backward: three launches (partial
    sums, the per-channel results, the per-value pass). relu: None, or (bias, stored) when
    the ReLU after the batch norm is folded in (minidnn/fusion.py): gy is then the ReLU's
    output gradient, masked here where the ReLU's output, recomputed from x with the
    forward's operations and stored in the maps' dtype (`stored` is the CPU kernel's
    business), is not > 0. sums: handed_sums's of gy, taken by the add before (no relu):
    the first launch is then not needed."""
    geometry = _geometry(x, gy) if gx is None else _geometry(x, gy, gx)
    n, c, hw, *_ = geometry
    bias = relu[0] if relu is not None else weight     # (not read without relu)
    if sums is not None and relu is not None:
        raise ValueError("handed sums are of a gradient no ReLU masks")
    partial, parts = sums if sums is not None else \
        _channel_partials(1 if relu is None else 2, geometry, x, gy,
                          (mean, invstd, weight, bias))
    coef = cp.empty((6, c), channel_dtype(x))   # one allocation: each costs host time
    _module.get_function(f"bn_finish_backward<{_channel_ctype(x)}>")(
        (c,), (_PART_THREADS,),
        (partial, np.int32(parts), np.float64(n * hw), mean, weight, invstd, bias,
         np.int32(relu is not None), gweight, gbias, coef, np.int32(c)))
    if gx is None:
        return
    _per_value("bn_grad_last" if relu is None else "bn_grad_relu_last",
               ("bn_grad_planes", "0" if relu is None else "1"), geometry, (x, gy, gx), coef)


def relu_mask(x, gy, mean, invstd, weight, bias, stored=None) -> None:
    """gy (in place) = gy where the output of the ReLU after the batch norm, recomputed from x
    with the forward's operations, is > 0, else 0: that ReLU's backward, for a batch norm
    whose statistics come from elsewhere (distributed/sync_batchnorm.py). stored: as
    batchnorm_backward's (the maps' dtype here)."""
    geometry = _geometry(x, gy)
    c = x.shape[1]
    coef = cp.empty((6, c), channel_dtype(x))
    coef[4:] = _forward_coefficients(mean, invstd, weight, bias)
    _per_value("bn_relu_mask_last", ("bn_grad_planes", "2"), geometry, (x, gy, gy), coef)
