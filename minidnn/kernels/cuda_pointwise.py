"""Pointwise passes over feature maps at memory speed: ReLU (with or without a bit mask), the
convolution's bias add, the add of two maps (with or without the ReLU after it, forward and
backward) and dropout's scaling by a mask, as CuPy raw kernels.

Each of these reads and writes every value once, so only memory bandwidth bounds them. Two
things get them there (CuPy's ElementwiseKernel reached about a third of it on large maps):
* A thread moves one 16-byte vector (4 floats, 2 doubles or 8 bfloat16) per load and store,
  when every array starts 16-byte aligned and the size allows; otherwise one value (the same
  code with a vector of one).
* Index math is 32-bit: a launch covers fewer than 2**31 values, and larger arrays run as
  several launches (the bias add's per-value channel comes from two divisions by launch
  constants, cuda_divide.py).

ReLU forward and backward may run in place (y is x, gx is gy): each thread reads its values
before it writes them. The `_bits` pair keeps for backward one bit per value instead of the
output (1/32 of the bytes): bit i % 8 of byte i // 8 is `y[i] > 0`, NumPy's little-endian
packbits order. Forward builds each 32-bit word of the mask from the 32 / VEC threads that
hold its values, OR-ing their VEC-bit pieces across lanes with warp shuffles.

The kernels allocate nothing and never synchronize with the host; they run on CuPy's current
stream. Feature maps are dense, NCHW or NHWC (kernels/mapformat.py): ReLU runs over the
values in memory order (so a ReLU mask lists them in that order, which is all its backward
needs), and the bias add has a channels-last twin in which a value's channel is its index
modulo C. Any other strides go through CuPy (any layout, slower).

Maps are float32, float64 or bfloat16 (mixed precision, kernels/mapformat.py); per-channel
arrays (a bias, its gradient) are in the dtype the maps compute in: their own, float32 beside
bf16 maps. The contract on bf16 maps: every value is computed in float32 from the widened
(exact) inputs and rounded once to bf16, to nearest even with a NaN kept quiet (STORAGE_SOURCE's
`narrow`, float_to_bf16's rule). So a kernel gives the bits of bf16_to_float on its bf16
inputs, then the float32 kernel, then float_to_bf16 on each bf16 output; the bias gradient is
the float32 kernel's, summed in its order. Two details: ReLU's selections copy the stored bf16
value, which is its own rounding except for a signalling NaN (a gradient passes one on
unquieted); and a ReLU mask holds the bits of the stored y > 0, so where a positive float32
sum below bf16's least subnormal is stored as 0, the fused bias-and-ReLU pass's bit is 0, as
its two passes' is.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from ..backend import same_memory
from . import cpu as _cpu
from .column_sums import column_blocks
from .cuda_divide import DIVIDE_SOURCE, INDEX_LIMIT, divider
from .mapformat import common_layout, copy_values, in_memory_order, is_bfloat16, \
    is_channels_last, pixel_rows, pointwise_views

#: CUDA source of the 16-byte vectors the per-value kernels move (here and in
#: cuda_batchnorm.py); paste it into a kernel module's source.
VECTOR_SOURCE = r"""
// VEC consecutive values of type T, moved by one load or store of VEC * sizeof(T) bytes.
template<typename T, int VEC> struct __align__(sizeof(T) * VEC) Pack { T v[VEC]; };

template<typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> load(const T* p, unsigned int k) {
    return reinterpret_cast<const Pack<T, VEC>*>(p)[k];
}

template<typename T, int VEC>
__device__ __forceinline__ void store(T* p, unsigned int k, const Pack<T, VEC>& a) {
    reinterpret_cast<Pack<T, VEC>*>(p)[k] = a;
}
"""

#: CUDA source of the storage types of maps (float, double, bf16) and the arithmetic they
#: compute in (here and in cuda_pool.py): acc_t<T>, widen (exact), narrow<T> (rounds once).
STORAGE_SOURCE = r"""
// bfloat16: the top 16 bits of a float32, stored as they are (no arithmetic of its own).
struct bf16 { unsigned short bits; };

// The type a map of T computes in: float for bf16, T itself otherwise.
template<typename T> struct Acc { typedef T type; };
template<> struct Acc<bf16> { typedef float type; };
template<typename T> using acc_t = typename Acc<T>::type;

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ double widen(double v) { return v; }
__device__ __forceinline__ float widen(bf16 v) {
    return __uint_as_float((unsigned int)v.bits << 16);
}

// float32 -> bf16 bits rounded to nearest even (subnormals kept); a NaN stays a (quiet) NaN
// of the same sign and payload's top bits. From compute capability 8.0 the hardware's
// conversion rounds, one instruction where the integer path takes about eight (the bf16
// passes that compute most per value gain most: benchmarks/RESULTS.md, wave 20), and a NaN
// gets the integer path's bits; before 8.0, add 0x7fff plus the kept half's lowest bit,
// then truncate. Both give the same bits.
__device__ __forceinline__ unsigned short bf16_bits(float x) {
    const unsigned int u = __float_as_uint(x);
#if __CUDA_ARCH__ >= 800
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
    return x != x ? (unsigned short)((u >> 16) | 0x40u) : r;
#else
    return (u & 0x7fffffffu) > 0x7f800000u
        ? (unsigned short)((u >> 16) | 0x40u)
        : (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}

// A computed value stored as T: as it is for float and double, rounded once for bf16.
template<typename T> __device__ __forceinline__ T narrow(acc_t<T> v) { return v; }
template<> __device__ __forceinline__ bf16 narrow<bf16>(float v) { return bf16{bf16_bits(v)}; }
"""

#: CUDA source of float and double operations each rounded on its own (for cuda_sgd.py and
#: cuda_batchnorm.py): never contracted into a fused multiply-add, which the compiler may
#: place differently in two kernels whose bits must agree.
ROUNDED_SOURCE = r"""
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ double add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double sub(double a, double b) { return __dsub_rn(a, b); }
"""

#: CUDA source of a column pass's rows and end (here and in cuda_pool.py): a block of
#: (width, 8) threads, thread (x, y) holding VEC adjacent columns c0 ... of its row lane y's sums.
COLUMN_SOURCE = r"""
// The rows row lane y of block b adds, in turn: first, first + step, ... (< end). COLUMN_ROWS
// arguments (run_columns): each block a contiguous share of span rows (block_stride = span,
// row_step = 8), or rows strided over the map (block_stride = 8, span = rows, row_step =
// 8 * blocks: block b takes rows 8b ... 8b + 7, then 8(b + blocks) ...).
#define COLUMN_ROWS long long rows, int C, long long block_stride, long long span, \
                    long long row_step
struct RowRange { long long first, end, step; };

__device__ __forceinline__ RowRange column_rows(long long rows, long long block_stride,
                                                long long span, long long row_step) {
    const long long base = blockIdx.x * block_stride;
    return RowRange{base + threadIdx.y, min(base + span, rows), row_step};
}

// partial[blockIdx.x, c0 + j] = the sum of acc[j] over the block's 8 row lanes, added in lane
// order. Every thread of the block calls it (a barrier inside).
template<typename A, int VEC>
__device__ __forceinline__ void store_column_sums(const A (&acc)[VEC], A* __restrict__ partial,
                                                  int C, int c0) {
    __shared__ A lanes[8][32 * VEC];
    #pragma unroll
    for (int j = 0; j < VEC; ++j) lanes[threadIdx.y][threadIdx.x * VEC + j] = acc[j];
    __syncthreads();
    if (threadIdx.y == 0) {
        #pragma unroll
        for (int j = 0; j < VEC; ++j) {
            if (c0 + j >= C) break;
            A sum = 0;
            #pragma unroll
            for (int lane = 0; lane < 8; ++lane) sum += lanes[lane][threadIdx.x * VEC + j];
            partial[blockIdx.x * (long long)C + c0 + j] = sum;
        }
    }
}
"""

_SOURCE = DIVIDE_SOURCE + VECTOR_SOURCE + STORAGE_SOURCE + COLUMN_SOURCE + r"""
// Thread k of a launch owns values k * VEC ... k * VEC + VEC - 1; n is a multiple of VEC.
// Maps are T, per-channel arrays and sums acc_t<T>; comparisons are on widened values (never
// on a bf16's bits), and a selection copies the stored value (narrow<T>(0) is T's zero).

template<typename T, int VEC>
__global__ void relu_forward(const T* x, T* y, unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    Pack<T, VEC> a = load<T, VEC>(x, k);
    #pragma unroll
    for (int j = 0; j < VEC; ++j) a.v[j] = widen(a.v[j]) > 0 ? a.v[j] : narrow<T>(0);
    store<T, VEC>(y, k, a);
}

template<typename T, int VEC>
__global__ void relu_backward(const T* y, const T* gy, T* gx, unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    const Pack<T, VEC> out = load<T, VEC>(y, k);
    Pack<T, VEC> g = load<T, VEC>(gy, k);
    #pragma unroll
    for (int j = 0; j < VEC; ++j) g.v[j] = widen(out.v[j]) > 0 ? g.v[j] : narrow<T>(0);
    store<T, VEC>(gx, k, g);
}

template<typename T, int VEC>
__global__ void add(const T* a, const T* b, T* out, unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    Pack<T, VEC> x = load<T, VEC>(a, k);
    const Pack<T, VEC> y = load<T, VEC>(b, k);
    #pragma unroll
    for (int j = 0; j < VEC; ++j) x.v[j] = narrow<T>(widen(x.v[j]) + widen(y.v[j]));
    store<T, VEC>(out, k, x);
}

// A residual add with the ReLU after it (minidnn/fusion.py): the sum stored as add stores it,
// then relu_forward's selection on that stored value; out may be a or b.
template<typename T, int VEC>
__global__ void add_relu(const T* a, const T* b, T* out, unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    Pack<T, VEC> x = load<T, VEC>(a, k);
    const Pack<T, VEC> y = load<T, VEC>(b, k);
    #pragma unroll
    for (int j = 0; j < VEC; ++j) {
        const T sum = narrow<T>(widen(x.v[j]) + widen(y.v[j]));
        x.v[j] = widen(sum) > 0 ? sum : narrow<T>(0);
    }
    store<T, VEC>(out, k, x);
}

// Its backward: relu_backward's selection, stored to both inputs' gradients (gx0 may be gy).
template<typename T, int VEC>
__global__ void relu_mask_copy(const T* y, const T* gy, T* gx0, T* gx1, unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    const Pack<T, VEC> out = load<T, VEC>(y, k);
    Pack<T, VEC> g = load<T, VEC>(gy, k);
    #pragma unroll
    for (int j = 0; j < VEC; ++j) g.v[j] = widen(out.v[j]) > 0 ? g.v[j] : narrow<T>(0);
    store<T, VEC>(gx0, k, g);
    store<T, VEC>(gx1, k, g);
}

// Vector k of gy + g2 (a gradient sum the add takes over, minidnn/fusion.py): the sum stored
// as add stores it, then relu_backward's selection where y > 0.
template<typename T, int VEC>
__device__ Pack<T, VEC> masked_sum(const T* y, const T* gy, const T* g2, unsigned int k) {
    const Pack<T, VEC> out = load<T, VEC>(y, k);
    Pack<T, VEC> g = load<T, VEC>(gy, k);
    const Pack<T, VEC> h = load<T, VEC>(g2, k);
    #pragma unroll
    for (int j = 0; j < VEC; ++j) {
        const T sum = narrow<T>(widen(g.v[j]) + widen(h.v[j]));
        g.v[j] = widen(out.v[j]) > 0 ? sum : narrow<T>(0);
    }
    return g;
}

// relu_mask_copy of gy + g2; gx0 may be gy.
template<typename T, int VEC>
__global__ void relu_mask_sum_copy(const T* y, const T* gy, const T* g2, T* gx0, T* gx1,
                                   unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    const Pack<T, VEC> g = masked_sum<T, VEC>(y, gy, g2, k);
    store<T, VEC>(gx0, k, g);
    store<T, VEC>(gx1, k, g);
}

// The same to one gradient (bn_grad, minidnn/fusion.py); gx may be gy.
template<typename T, int VEC>
__global__ void relu_mask_sum(const T* y, const T* gy, const T* g2, T* gx, unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    store<T, VEC>(gx, k, masked_sum<T, VEC>(y, gy, g2, k));
}

// y = (x * mask) * scale, two products each rounded in acc_t<T> (NumPy's multiply, then its
// *= scale), then stored as T. mask: one byte per value (0 or 1).
template<typename T, int VEC>
__global__ void scale_by_mask(const T* x, T* y, const unsigned char* mask, acc_t<T> scale,
                              unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    Pack<T, VEC> a = load<T, VEC>(x, k);
    const Pack<unsigned char, VEC> m = load<unsigned char, VEC>(mask, k);
    #pragma unroll
    for (int j = 0; j < VEC; ++j) a.v[j] = narrow<T>(widen(a.v[j]) * (acc_t<T>)m.v[j] * scale);
    store<T, VEC>(y, k, a);
}

// mask: the launch's words (value k * VEC lies in word k * VEC / 32). Every lane of a warp
// takes part in the shuffles (the block size is a multiple of 32); lanes past the end add no
// bits, so the last word's unused bits are 0.
template<typename T, int VEC>
__global__ void relu_forward_bits(const T* x, T* y, unsigned int* mask, unsigned int n) {
    const int LANES = 32 / VEC;                        // threads per mask word
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    const bool active = k < n / VEC;
    unsigned int bits = 0;
    if (active) {
        Pack<T, VEC> a = load<T, VEC>(x, k);
        #pragma unroll
        for (int j = 0; j < VEC; ++j) {
            const bool positive = widen(a.v[j]) > 0;
            bits |= (unsigned int)positive << j;
            a.v[j] = positive ? a.v[j] : narrow<T>(0);
        }
        store<T, VEC>(y, k, a);
    }
    bits <<= VEC * (k % LANES);
    #pragma unroll
    for (int offset = LANES / 2; offset > 0; offset /= 2)
        bits |= __shfl_xor_sync(0xffffffffu, bits, offset);
    if (active && k % LANES == 0) mask[k / LANES] = bits;
}

template<typename T, int VEC>
__global__ void relu_backward_bits(const T* gy, T* gx, const unsigned int* mask,
                                   unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    const unsigned int first = k * VEC;
    const unsigned int bits = mask[first / 32] >> (first % 32);
    Pack<T, VEC> g = load<T, VEC>(gy, k);
    #pragma unroll
    for (int j = 0; j < VEC; ++j) g.v[j] = (bits >> j) & 1u ? g.v[j] : narrow<T>(0);
    store<T, VEC>(gx, k, g);
}

// y (planes of hw values; plane p has channel (p % C)) += b[channel]. The launch starts at a
// plane whose channel is c0; hw is a multiple of VEC, so a vector never straddles planes.
template<typename T, int VEC>
__global__ void bias_add(T* y, const acc_t<T>* b, unsigned int c0, unsigned int C,
                         unsigned int hw_mul, unsigned int hw_shift, unsigned int c_mul,
                         unsigned int c_shift, unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    const unsigned int plane = c0 + divide(k * VEC, hw_mul, hw_shift);
    const acc_t<T> bias = b[plane - divide(plane, c_mul, c_shift) * C];
    Pack<T, VEC> a = load<T, VEC>(y, k);
    #pragma unroll
    for (int j = 0; j < VEC; ++j) a.v[j] = narrow<T>(widen(a.v[j]) + bias);
    store<T, VEC>(y, k, a);
}

// Channels last: y (pixels of C values) += b. The launch starts at a pixel boundary; C is a
// multiple of VEC, so a vector never straddles pixels and its first value's channel is
// (k * VEC) mod C.
template<typename T, int VEC>
__global__ void bias_add_last(T* y, const acc_t<T>* b, unsigned int C, unsigned int c_mul,
                              unsigned int c_shift, unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    const unsigned int first = k * VEC;
    const unsigned int c = first - divide(first, c_mul, c_shift) * C;
    Pack<T, VEC> a = load<T, VEC>(y, k);
    #pragma unroll
    for (int j = 0; j < VEC; ++j) a.v[j] = narrow<T>(widen(a.v[j]) + b[c + j]);
    store<T, VEC>(y, k, a);
}

// Channels last, with a convolution's bias added first (minidnn/fusion.py): y = max(x + b, 0)
// over (pixels, C) in memory; the launch starts at a pixel boundary and C is a multiple of
// VEC. The same two float operations as bias_add_last then relu_forward: the same bits (on
// bf16 too: rounding keeps signs and order, so max(round(v), 0) = round(max(v, 0))).
template<typename T, int VEC>
__global__ void relu_bias_last(const T* x, T* y, const acc_t<T>* b, unsigned int C,
                               unsigned int c_mul, unsigned int c_shift, unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    const unsigned int first = k * VEC;
    const unsigned int c = first - divide(first, c_mul, c_shift) * C;
    Pack<T, VEC> a = load<T, VEC>(x, k);
    #pragma unroll
    for (int j = 0; j < VEC; ++j) {
        const acc_t<T> v = widen(a.v[j]) + b[c + j];
        a.v[j] = narrow<T>(v > 0 ? v : 0);
    }
    store<T, VEC>(y, k, a);
}

// The same with relu_forward_bits' mask (the launch starts at a multiple of 32 values); a bit
// is that of the stored value > 0, as the two passes give it (on bf16 a positive v below the
// least subnormal is stored as 0).
template<typename T, int VEC>
__global__ void relu_bias_bits_last(const T* x, T* y, unsigned int* mask, const acc_t<T>* b,
                                    unsigned int C, unsigned int c_mul, unsigned int c_shift,
                                    unsigned int n) {
    const int LANES = 32 / VEC;
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    const bool active = k < n / VEC;
    unsigned int bits = 0;
    if (active) {
        const unsigned int first = k * VEC;
        const unsigned int c = first - divide(first, c_mul, c_shift) * C;
        Pack<T, VEC> a = load<T, VEC>(x, k);
        #pragma unroll
        for (int j = 0; j < VEC; ++j) {
            const acc_t<T> v = widen(a.v[j]) + b[c + j];
            a.v[j] = narrow<T>(v > 0 ? v : 0);
            bits |= (unsigned int)(widen(a.v[j]) > 0) << j;
        }
        store<T, VEC>(y, k, a);
    }
    bits <<= VEC * (k % LANES);
    #pragma unroll
    for (int offset = LANES / 2; offset > 0; offset /= 2)
        bits |= __shfl_xor_sync(0xffffffffu, bits, offset);
    if (active && k % LANES == 0) mask[k / LANES] = bits;
}

// Channels last: partial[blockIdx.x, c] = sum over the rows r of this block's share (rows of
// C values) of v[r, c], in acc_t<T>, where MODE says what v is and what else the pass does:
//   SUMS       v = g (read from gy)                  (a bias gradient)
//   RELU       v = gy where y > 0, else 0; gx = v    (relu_backward, then SUMS of its result)
//   RELU_BITS  the same with relu_forward_bits' mask in place of y (value i: bit i % 32 of
//              word i / 32)
// The order of every sum is fixed and the same whatever VEC: row lane ly (of 8) of a block
// adds its rows (column_rows) in turn, then the 8 lanes are added in order. So the
// fused passes give the bits of the two, and bf16 maps the float32 kernel's sums. A thread
// holds VEC adjacent columns (one 16-byte vector when C is a multiple of it); a block is
// min(32, C / VEC) column groups x 8 row lanes. gx may be gy (each value is read, then
// written, by one thread).
enum ColumnMode { SUMS = 0, RELU = 1, RELU_BITS = 2 };

template<typename T, int VEC, int MODE>
__global__ void column_pass(const T* y, const T* gy, T* gx, const unsigned int* mask,
                            acc_t<T>* __restrict__ partial, COLUMN_ROWS) {
    typedef acc_t<T> A;
    const int c0 = (blockIdx.y * blockDim.x + threadIdx.x) * VEC;
    const RowRange rr = column_rows(rows, block_stride, span, row_step);
    A acc[VEC];
    #pragma unroll
    for (int j = 0; j < VEC; ++j) acc[j] = 0;
    if (c0 < C) {
        #pragma unroll 4
        for (long long r = rr.first; r < rr.end; r += rr.step) {
            const long long i = r * C + c0;
            Pack<T, VEC> g = *reinterpret_cast<const Pack<T, VEC>*>(gy + i);
            if (MODE == RELU) {
                const Pack<T, VEC> out = *reinterpret_cast<const Pack<T, VEC>*>(y + i);
                #pragma unroll
                for (int j = 0; j < VEC; ++j)
                    g.v[j] = widen(out.v[j]) > 0 ? g.v[j] : narrow<T>(0);
            } else if (MODE == RELU_BITS) {
                const unsigned int word = mask[i >> 5];     // VEC divides 32: one word
                #pragma unroll
                for (int j = 0; j < VEC; ++j)
                    g.v[j] = (word >> ((i + j) & 31)) & 1u ? g.v[j] : narrow<T>(0);
            }
            if (MODE != SUMS) *reinterpret_cast<Pack<T, VEC>*>(gx + i) = g;
            #pragma unroll
            for (int j = 0; j < VEC; ++j) acc[j] += widen(g.v[j]);
        }
    }
    store_column_sums<A, VEC>(acc, partial, C, c0);
}
"""

_KERNELS = ("add", "add_relu", "relu_mask_copy", "relu_mask_sum_copy", "relu_mask_sum",
            "relu_forward", "relu_backward", "relu_forward_bits", "relu_backward_bits",
            "bias_add", "bias_add_last", "relu_bias_last", "relu_bias_bits_last",
            "scale_by_mask")
#: The modes of column_pass (its ColumnMode).
_COLUMN_MODES = ("SUMS", "RELU", "RELU_BITS")

# bfloat16 <-> float32 on the raw 16-bit patterns (bf16 is the top half of a float32), by
# STORAGE_SOURCE's rounding.
_BF16_SOURCE = VECTOR_SOURCE + STORAGE_SOURCE + r"""
// Thread k converts values k * VEC ... k * VEC + VEC - 1 (n a multiple of VEC).
template<int VEC>
__global__ void float_to_bf16(const float* x, unsigned short* y, unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    const Pack<float, VEC> a = load<float, VEC>(x, k);
    Pack<unsigned short, VEC> b;
    #pragma unroll
    for (int j = 0; j < VEC; ++j) b.v[j] = bf16_bits(a.v[j]);
    store<unsigned short, VEC>(y, k, b);
}

template<int VEC>
__global__ void bf16_to_float(const unsigned short* x, float* y, unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    const Pack<unsigned short, VEC> a = load<unsigned short, VEC>(x, k);
    Pack<float, VEC> b;
    #pragma unroll
    for (int j = 0; j < VEC; ++j) b.v[j] = __uint_as_float((unsigned int)a.v[j] << 16);
    store<float, VEC>(y, k, b);
}
"""
#: Values per thread of the conversions: a 16-byte vector of the float32 side.
_CONVERT_VEC = 4
_CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
#: The dtype maps of each C type compute in, which their per-channel arrays (a bias, its
#: gradient) and scalars take: float32 beside bf16 maps.
ACC_DTYPES = {"float": np.dtype(np.float32), "double": np.dtype(np.float64),
              "bf16": np.dtype(np.float32)}
_VECTOR_BYTES = 16


def map_ctype(dtype) -> str | None:
    """The C type (STORAGE_SOURCE) of maps of `dtype`: 'float', 'double' or 'bf16' (bfloat16,
    recognized without importing ml_dtypes); None for any other dtype."""
    return "bf16" if is_bfloat16(dtype) else _CTYPES.get(np.dtype(dtype))


def _instances():
    for ctype, size in (("float", 4), ("double", 8), ("bf16", 2)):
        for vec in (1, _VECTOR_BYTES // size):
            for name in _KERNELS:
                yield f"{name}<{ctype}, {vec}>"
        for vec in (1, _VECTOR_BYTES // size):
            for mode in _COLUMN_MODES:
                yield f"column_pass<{ctype}, {vec}, {mode}>"


_module = cp.RawModule(code=_SOURCE, name_expressions=list(_instances()))
_bf16_module = cp.RawModule(code=_BF16_SOURCE, name_expressions=[
    f"{name}<{vec}>" for name in ("float_to_bf16", "bf16_to_float") for vec in (1, _CONVERT_VEC)])

_THREADS = 256          # a multiple of 32: warps never straddle blocks
#: Values per launch; larger arrays run as several launches of this many (a multiple of every
#: vector width and of 32, so the pieces keep the vectors and the mask words whole). The bias
#: add keeps each piece's operands below 2**31 by the same bound.
_CHUNK = 2**30


def _ctype(name: str, arrays) -> str:
    """The C type of the maps (one dtype: float32, float64 or bfloat16); raises on anything
    the kernels would misread: another dtype, a strided array, mismatched sizes."""
    dtype = np.dtype(arrays[0].dtype)
    ctype = map_ctype(dtype)
    if ctype is None or any(np.dtype(a.dtype) != dtype for a in arrays):
        raise TypeError(f"{name}: takes float32, float64 or bfloat16 maps of one dtype, got "
                        f"{[str(a.dtype) for a in arrays]}")
    for a in arrays:
        if not a.flags.c_contiguous:
            raise ValueError(f"{name}: expected C-contiguous arrays, got strides {a.strides} "
                             f"for shape {a.shape}")
        if a.size != arrays[0].size:
            raise ValueError(f"{name}: arrays of {arrays[0].size} and {a.size} values")
    return ctype


def _vector(arrays, n: int, unit: int | None = None) -> int:
    """Values per thread: a 16-byte vector when every array starts 16-byte aligned and both n
    and `unit` (if given: a run of values no vector may straddle) are multiples of it, else 1."""
    vec = _VECTOR_BYTES // arrays[0].dtype.itemsize
    aligned = all(a.data.ptr % _VECTOR_BYTES == 0 for a in arrays)
    whole = n % vec == 0 and (unit is None or unit % vec == 0)
    return vec if aligned and whole else 1


def _run(name: str, ctype: str, vec: int, n: int, args: tuple, module=None) -> None:
    """One launch of kernel `name` (of `module`, default this file's) over n (< 2**31) values,
    `vec` per thread."""
    if n:
        threads = n // vec
        kernel = (module or _module).get_function(f"{name}<{ctype}, {vec}>")
        kernel(((threads + _THREADS - 1) // _THREADS,), (_THREADS,), args + (np.uint32(n),))


def run_per_pixel(name: str, maps, per_channel, mask=None, module=None) -> None:
    """Kernel `name<T, VEC>` (of `module`, default this file's) over channels-last maps of one
    shape (N, C, H, W), seen as (pixels, C) matrices, one thread per VEC values; a value's
    channel is its index modulo C. The kernel takes (the maps, the words of a ReLU `mask`
    when given, the per-channel arrays (C,), C, C's divider, the launch's values). Launches
    hold at most _CHUNK values and start at pixels and at whole mask words."""
    rows = [pixel_rows(a) for a in maps]
    pixels, channels = rows[0].shape
    if not rows[0].size:
        return
    ctype = _ctype(name, rows)
    words = () if mask is None else (_words(mask, rows[0].size),)
    vec = _vector(rows, rows[0].size, unit=channels)
    by_c = divider(channels)
    per_launch = max(_CHUNK // channels // 32 * 32, 32)
    for r0 in range(0, pixels, per_launch):
        pieces = tuple(r[r0:r0 + per_launch] for r in rows)
        _run(name, ctype, vec, pieces[0].size,
             pieces + tuple(w[r0 * channels // 32:] for w in words)
             + tuple(per_channel) + (np.uint32(channels), *by_c), module)


def _pieces(n: int):
    """(start, stop) of the launches over n values."""
    return ((s, min(s + _CHUNK, n)) for s in range(0, n, _CHUNK))


def _flat(name: str, arrays) -> list:
    """`arrays` (one shape, dense in one layout) as flat views in memory order."""
    if any(a.shape != arrays[0].shape for a in arrays):
        raise ValueError(f"{name}: arrays of shapes {[a.shape for a in arrays]}")
    common_layout(name, arrays)
    return [in_memory_order(a) for a in arrays]


def _flat_pass(name: str, arrays, mask=None) -> None:
    """Kernel `name` over the values of `arrays` (one shape, dense in one layout) in memory
    order, and the words of a ReLU mask after them when given, in launches of at most _CHUNK
    values."""
    flat = _flat(name, arrays)
    ctype = _ctype(name, flat)
    n = flat[0].size
    words = () if mask is None else (_words(mask, n),)
    vec = _vector(flat, n)
    for s, e in _pieces(n):
        _run(name, ctype, vec, e - s,
             tuple(a[s:e] for a in flat) + tuple(w[s // 32:] for w in words))


def add(a, b, out) -> None:
    """out = a + b, value by value; out may be a or b. Arrays of one shape, dense in one
    layout (NCHW or channels last), float32, float64 or bfloat16: one vectorized pass in
    memory order (CuPy's own add reached about 70% of memory speed on ResNet-50's maps).
    Anything else goes to CuPy's add."""
    try:
        _flat_pass("add", (a, b, out))
    except (TypeError, ValueError):
        cp.add(a, b, out=out)


def add_relu(a, b, out) -> None:
    """out = max(a + b, 0), value by value (a residual add with the ReLU after it folded in:
    minidnn/fusion.py); out may be a or b. One vectorized pass over arrays as add's; anything
    else runs add then relu_forward, whose bits the pass gives."""
    try:
        _flat_pass("add_relu", (a, b, out))
    except (TypeError, ValueError):
        add(a, b, out)
        relu_forward(out, out)


def relu_mask_copy(y, gy, gx0, gx1) -> None:
    """gx0 = gx1 = gy where y > 0, else 0 (the backward of an add with the ReLU after it
    folded in: y is that ReLU's output); gx0 may be gy itself, gx1 None (not wanted). One
    pass reading gy and y, writing both, over arrays of one shape dense in one layout;
    anything else runs relu_backward and a copy, whose bits the pass gives."""
    if gx1 is not None:
        try:
            _flat_pass("relu_mask_copy", (y, gy, gx0, gx1))
            return
        except (TypeError, ValueError):
            pass
    relu_backward(y, gy, gx0)
    if gx1 is not None:
        copy_values(*pointwise_views(gx1, gx0))


def relu_mask_sum_copy(y, gy, g2, gx0, gx1) -> None:
    """gx0 = gx1 = (gy + g2) where y > 0, else 0 (relu_mask_copy of the sum, rounded once
    as add rounds it: a gradient sum the add takes over, minidnn/fusion.py); gx0 may be gy,
    gx1 None. One pass reading gy, g2 and y and writing both, over arrays of one shape dense
    in one layout; anything else runs add then relu_mask_copy, whose bits the pass gives."""
    if gx1 is not None:
        try:
            _flat_pass("relu_mask_sum_copy", (y, gy, g2, gx0, gx1))
            return
        except (TypeError, ValueError):
            pass
    add(gy, g2, gx0)
    relu_mask_copy(y, gx0, gx0, gx1)


def relu_mask_sum(y, gy, g2, gx) -> None:
    """gx = (gy + g2) where y > 0, else 0: relu_mask_sum_copy with one output (the add's
    gradient that a batch norm reads on: minidnn/fusion.py, bn_grad); gx may be gy. One
    pass reading gy, g2 and y and writing gx, over arrays as relu_mask_sum_copy's; anything
    else runs add then relu_backward, whose bits the pass gives."""
    try:
        _flat_pass("relu_mask_sum", (y, gy, g2, gx))
    except (TypeError, ValueError):
        add(gy, g2, gx)
        relu_backward(y, gx, gx)


def scale_by_mask(x, mask, y, scale) -> None:
    """y = x * mask * scale, value by value (inverted dropout: scale = 1 / (1 - p)); y may be
    x. x * mask, then times scale, each product rounded in the dtype the maps compute in:
    cpu.py's NumPy operations for float32 and float64 maps (scale rounded to their dtype),
    float32 then one rounding for bf16 maps. x, mask (bool or uint8), y: one shape; dense in
    one layout, else (float maps only) cpu.py's operations on CuPy's strided arrays."""
    if np.dtype(mask.dtype) not in (np.bool_, np.uint8):
        raise TypeError(f"scale_by_mask: mask must be bool or uint8, got {mask.dtype}")
    try:
        fx, fy, keep = _flat("scale_by_mask", (x, y, mask))
    except ValueError:
        if is_bfloat16(x.dtype):
            raise
        _cpu.scale_by_mask(x, mask, y, scale)
        return
    ctype = _ctype("scale_by_mask", (fx, fy))
    vec = _vector((fx, fy, keep), fx.size)
    factor = ACC_DTYPES[ctype].type(scale)
    for s, e in _pieces(fx.size):
        _run("scale_by_mask", ctype, vec, e - s, (fx[s:e], fy[s:e], keep[s:e], factor))


def relu_forward(x, y, bias=None) -> None:
    """y = max(x + bias, 0) (bias (C,) along axis 1 when given: a convolution's, moved here by
    minidnn/fusion.py; float32 beside bf16 maps). x, y: same shape and dtype, contiguous; y
    may be x."""
    if bias is None:
        _flat_pass("relu_forward", (x, y))
    else:
        _relu_bias(x, y, bias, None)


def relu_backward(y, gy, gx, gb=None) -> None:
    """gx = gy where y > 0, else 0; gx may be gy. gb (C,), when given: also the gradient of
    the bias this ReLU added (minidnn/fusion.py), bias_grad(gx, gb), in the same pass on
    channels-last maps."""
    if gb is not None and _column_pass("RELU", (y, gy, gx), gb):
        return
    _flat_pass("relu_backward", (y, gy, gx))
    if gb is not None:
        bias_grad(gx, gb)


def _words(mask, n: int):
    """The mask as uint32 words, checked: uint8, 4-byte aligned, relu_mask_bytes(n) long."""
    if np.dtype(mask.dtype) != np.uint8 or not mask.flags.c_contiguous:
        raise TypeError(f"ReLU mask must be contiguous uint8, got {mask.dtype}")
    need = (n + 31) // 32 * 4
    if mask.size < need or mask.data.ptr % 4:
        raise ValueError(f"ReLU mask of {n} values needs {need} bytes, 4-byte aligned; got "
                         f"{mask.size} bytes at {mask.data.ptr:#x}")
    return mask[:need].view(np.uint32)


def relu_forward_bits(x, y, mask, bias=None) -> None:
    """y = max(x + bias, 0) as relu_forward, and mask (uint8, relu_mask_bytes(x.size),
    4-byte aligned) = bits of y > 0."""
    if bias is None:
        _flat_pass("relu_forward_bits", (x, y), mask)
    else:
        _relu_bias(x, y, bias, mask)


def _relu_bias(x, y, bias, mask) -> None:
    """The bias add and the ReLU in one pass over channels-last maps; elsewhere (NCHW) the
    two passes, which give the same bits."""
    if x.shape != y.shape:
        raise ValueError(f"relu_forward: arrays of shapes {x.shape} and {y.shape}")
    if x.ndim != 4 or common_layout("relu_forward", (x, y)) != "nhwc":
        if not same_memory(x, y):
            y[...] = x
        bias_add(y, bias)
        if mask is None:
            _flat_pass("relu_forward", (y, y))
        else:
            _flat_pass("relu_forward_bits", (y, y), mask)
        return
    _check_bias(pixel_rows(x), bias)
    run_per_pixel("relu_bias_last" if mask is None else "relu_bias_bits_last", (x, y), (bias,),
                  mask)


def relu_backward_bits(mask, gy, gx, gb=None) -> None:
    """gx = gy where the mask's bit is set, else 0; gx may be gy itself. gb: as relu_backward."""
    if gb is not None and _column_pass("RELU_BITS", (gy, gx), gb, mask):
        return
    _flat_pass("relu_backward_bits", (gy, gx), mask)
    if gb is not None:
        bias_grad(gx, gb)


def bias_add(y, b) -> None:
    """y (N, C, ...) += b (C,) along axis 1, in place. y is NCHW or NHWC (channels last);
    any other strides go through CuPy's broadcasting (slower)."""
    if not y.flags.c_contiguous:
        if is_channels_last(y):
            _check_bias(pixel_rows(y), b)
            run_per_pixel("bias_add_last", (y,), (b,))
        else:
            y += b.reshape((1, -1) + (1,) * (y.ndim - 2))
        return
    ctype = _check_bias(y, b)
    channels = y.shape[1]
    hw = y.size // max(y.shape[0] * channels, 1)
    if not hw:
        return
    planes_per_launch = max(_CHUNK // hw, 1)
    if planes_per_launch * hw >= INDEX_LIMIT:
        raise ValueError(f"bias_add: planes of {hw} values; each must hold fewer than 2**31")
    y = y.reshape(-1, hw)
    vec = _vector((y,), y.size, unit=hw)
    by_hw, by_c = divider(hw), divider(channels)
    for p0 in range(0, y.shape[0], planes_per_launch):
        piece = y[p0:p0 + planes_per_launch]
        _run("bias_add", ctype, vec, piece.size,
             (piece, b, np.uint32(p0 % channels), np.uint32(channels), *by_hw, *by_c))


def _check_bias(y2, b) -> str:
    """The C type of maps y2 (rows, C), once b is checked: contiguous (C,), in the dtype the
    maps compute in (float32 beside bf16 maps)."""
    ctype = _ctype("bias_add", (y2,))
    want = ACC_DTYPES[ctype]
    if b.dtype != want or b.shape != (y2.shape[1],) or not b.flags.c_contiguous:
        raise ValueError(f"bias_add: b must be contiguous {want} of shape ({y2.shape[1]},) "
                         f"beside {y2.dtype} maps, got {b.dtype} {b.shape}")
    return ctype


def bias_grad(gy, gb) -> None:
    """gb (C,) = sum of gy (N, C, H, W) over N, H and W (a convolution's bias gradient).
    Channels last: column sums in a fixed order (channel_sums). NCHW: summing each (n, c) row
    first reduces contiguous memory; reducing over axes (0, 2, 3) at once gives CuPy one
    thread block per channel, far too few to reach memory speed on large maps. bf16 maps sum
    in float32 (gb float32): NCHW ones are widened value by value as they are read, rather
    than trust CuPy's own bf16 sums to do so (a widened copy of the map would be a
    temporary as large as the map, which no plan counts)."""
    if _column_pass("SUMS", (gy,), gb):
        return
    n, c = gy.shape[:2]
    if is_bfloat16(gy.dtype):
        _sums_dtype("bias_grad", "bf16", gb)
        rows = _bf16_plane_sums(gy.view(np.uint16).reshape(n, c, -1), axis=2)
    else:
        rows = gy.reshape(n, c, -1).sum(axis=2)      # (N, C), a small temporary
    rows.sum(axis=0, out=gb)


# Sums of bf16 words (as uint16) in float32, each widened as it is read.
_bf16_plane_sums = cp.ReductionKernel(
    "uint16 x", "float32 y", "__uint_as_float((unsigned int)x << 16)", "a + b", "y = a", "0",
    "bf16_plane_sums", reduce_type="float")


def channel_sums(g, out) -> None:
    """out (C,) = sum of g (N, C, H, W), channels last, over N, H and W (the bias gradient),
    in a fixed order. Per-block partial sums (a small temporary), then their sum."""
    if not _column_pass("SUMS", (g,), out):
        raise ValueError(f"channel_sums: takes a channels-last map, got strides {g.strides}")


def _column_pass(mode: str, maps, out, mask=None) -> bool:
    """column_pass in `mode` (_COLUMN_MODES) over channels-last maps (N, C, H, W) seen as
    (pixels, C) matrices, then out (C,) = the sum of its per-block partial sums. `maps`: the
    map summed (SUMS), or (y, gy, gx) (RELU), or (gy, gx) (RELU_BITS, with `mask`). False (and
    nothing done) where the maps are not channels last."""
    if any(m.flags.c_contiguous or not is_channels_last(m) for m in maps):
        return False
    name = f"column_pass {mode}"
    rows2 = [pixel_rows(m) for m in maps]
    ctype = _ctype(name, rows2)
    rows, channels = rows2[0].shape
    vec = _VECTOR_BYTES // rows2[0].dtype.itemsize
    if channels % vec or any(r.data.ptr % _VECTOR_BYTES for r in rows2):
        vec = 1
    _sums_dtype(name, ctype, out)
    # The pointers a mode does not read stand in as the map summed (never dereferenced).
    g = rows2[0]
    y, gy, gx = tuple(rows2) if mode == "RELU" else (g, g, rows2[-1])
    words = g if mask is None else _words(mask, g.size)
    run_columns(_module.get_function(f"column_pass<{ctype}, {vec}, {mode}>"), rows, channels,
                vec, (y, gy, gx, words), out)
    return True


#: How the blocks of a column pass share the rows: True, strided over the map (block b takes
#: rows 8b ... 8b + 7, then 8(b + blocks) ...), so that the blocks running at once read and
#: write neighbouring memory; False, each block a contiguous share. The two add each
#: channel's values in other orders, so a bias gradient's bits differ between them; every
#: kernel of one setting (column_pass in each mode, cuda_pool.maxpool2d_backward_sums) adds
#: in the same order, so a fused pass and its parts agree.
STRIDED_COLUMNS = True


def run_columns(kernel, rows: int, channels: int, vec: int, args: tuple, out) -> None:
    """Runs a column pass (COLUMN_SOURCE's layout: column_pass, or cuda_pool's
    maxpool2d_backward_sums) over `rows` rows of `channels` columns, `vec` columns a thread:
    `args`, then its (partial, COLUMN_ROWS); then out (C,) = the sum of the per-block partial
    sums (a temporary of out's dtype, which the step's memory model counts:
    column_sums.py), added by column_totals."""
    groups = channels // vec
    width = min(32, groups)
    per_block, blocks = column_blocks(rows)
    stride, span, step = (8, rows, 8 * blocks) if STRIDED_COLUMNS else (per_block, per_block, 8)
    partial = cp.empty((blocks, channels), dtype=out.dtype)
    kernel((blocks, -(-groups // width)), (width, 8),
           args + (partial, np.int64(rows), np.int32(channels), np.int64(stride),
                   np.int64(span), np.int64(step)))
    column_totals(partial, out)


# out (C,) = the sum over the rows of a dense (rows, C) array, in a fixed order: thread (x, y)
# of a block of (32, TOTAL_LANES) adds rows y, y + TOTAL_LANES, ... of channel 32 b + x, then
# lane 0 adds the lanes' sums in lane order. A column pass's partial sums are (blocks, C), a
# few thousand rows of up to 512 channels: CuPy's reduction over axis 0 took about 40 us a
# call there (VGG-16: 16 calls a step).
TOTAL_LANES = 32
_TOTALS_SOURCE = r"""
template<typename A>
__global__ void column_totals(const A* g, A* out, long long rows, int channels) {
    __shared__ A lanes[TOTAL_LANES][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    A s = 0;
    if (c < channels)
        for (long long r = threadIdx.y; r < rows; r += TOTAL_LANES) s += g[r * channels + c];
    lanes[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < channels) {
        A t = lanes[0][threadIdx.x];
        for (int j = 1; j < TOTAL_LANES; ++j) t += lanes[j][threadIdx.x];
        out[c] = t;
    }
}
""".replace("TOTAL_LANES", str(TOTAL_LANES))
_totals_module = cp.RawModule(code=_TOTALS_SOURCE, name_expressions=[
    "column_totals<float>", "column_totals<double>"])


def column_totals(g, out) -> None:
    """out (C,) = g (rows, C), dense, summed over its rows (see _TOTALS_SOURCE's order);
    float32 or float64, out of g's dtype."""
    ctype = _CTYPES.get(np.dtype(g.dtype))
    if ctype is None or g.ndim != 2 or not g.flags.c_contiguous or out.dtype != g.dtype or \
            out.shape != (g.shape[1],) or not out.flags.c_contiguous:
        raise ValueError(f"column_totals: a dense float32 or float64 (rows, C) array and a "
                         f"(C,) one of its dtype; got {g.dtype} {g.shape}, {out.dtype} "
                         f"{out.shape}")
    rows, channels = g.shape
    if channels:
        _totals_module.get_function(f"column_totals<{ctype}>")(
            (-(-channels // 32),), (32, TOTAL_LANES), (g, out, np.int64(rows),
                                                       np.int32(channels)))


def _sums_dtype(name: str, ctype: str, out) -> np.dtype:
    """The dtype per-channel sums of `ctype` maps are taken in; TypeError unless `out` (where
    they go) has it."""
    acc = ACC_DTYPES[ctype]
    if np.dtype(out.dtype) != acc:
        raise TypeError(f"{name}: per-channel sums of {ctype} maps are {acc}, got {out.dtype}")
    return acc


def _convert(name: str, src, dst, src_bits, dst_bits) -> None:
    """Kernel `name` from src to dst (one shape, one dense layout), as raw words."""
    a, b = _flat(name, (src, dst))
    a, b = a.view(src_bits), b.view(dst_bits)
    vec = _CONVERT_VEC
    if a.size % vec or any(x.data.ptr % (vec * x.itemsize) for x in (a, b)):
        vec = 1
    kernel = _bf16_module.get_function(f"{name}<{vec}>")
    for s, e in _pieces(a.size):
        threads = (e - s) // vec
        kernel(((threads + _THREADS - 1) // _THREADS,), (_THREADS,),
               (a[s:e], b[s:e], np.uint32(e - s)))


def float_to_bf16(src, dst) -> None:
    """dst (bfloat16) = src (float32) rounded to nearest even, as ml_dtypes rounds."""
    _convert("float_to_bf16", src, dst, np.float32, np.uint16)


def bf16_to_float(src, dst) -> None:
    """dst (float32) = src (bfloat16), exactly."""
    _convert("bf16_to_float", src, dst, np.uint16, np.float32)
