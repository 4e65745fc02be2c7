"""Max and average pooling on the GPU as CuPy raw kernels (float32, float64 and bfloat16 maps).

Semantics are cpu.py's (PyTorch's): max-pool padding never wins, ties keep the first maximum in
(kh, kw) order and argmax is kh * KW + kw within the window; avg-pool divides by the window size
counting padding (count_include_pad) but never the part of a ceil_mode window past the padding.

Forward runs one thread per output element. Backward is a gather, not a scatter: every input
element sums, in a fixed order (oh ascending, then ow ascending), the gradients of the windows
that cover it. No atomics, so the result is the same bit for bit on every run. A backward thread
owns one *cell*: the SH x SW input elements whose rows and columns share one stride step
(input row h lies in cell row (h + PH) // SH), so the windows covering each of its elements
follow from the cell without a division.

Index math is 32-bit inside a launch: thread i is plane plane0 + i / per_plane, and its row and
column in that plane's grid are divmod(i % per_plane, cols). Both divisions are by numbers fixed
for the launch and run as a multiply-high, an add and a shift with constants from the host
(cuda_divide.py); only a plane's base offset is 64-bit. A tensor with 2**31 or more threads'
worth of work runs as several launches of whole planes.

The kernels allocate nothing and never synchronize with the host; they run on CuPy's current
stream. Shapes: x, gx (N, C, H, W); y, gy, argmax (N, C, OH, OW); all C-contiguous, or all
channels last (NHWC, kernels/mapformat.py). The channels-last twins (`*_last`) run one thread
per value, channel fastest, so that neighbouring threads touch neighbouring bytes, one image
per grid row (32-bit index math by launch constants, as above: with 64-bit divisions the
H200 ran VGG-16's NHWC max-pool backward at 17.3 ms a step against PyTorch's 7.8); they find
a value's window range with a division, and sum backward's windows in the same order as the
NCHW kernels, so both layouts give the same bits. Where the channels allow, max pooling on
float32 and bf16 maps runs the `_vec` kernels instead: the same code value for value, a thread
moving 16 bytes of channels with each load and store (VGG-16's pool1 at batch 256 on the H200:
forward 2.33 -> 1.24 ms, from about 1.85 to 3.5 TB/s; backward 1.41 -> 1.05 ms). 3x3 windows
at stride 1 (GoogLeNet's inception pools) run the `_run3_vec` kernels there: a thread covers a
run of pixels along a row and loads the pixels their windows share once (RUN3_POOLS); 2x2
windows that tile the input (VGG's pools) run `maxpool2d_forward_tiles2_vec`, which issues a
window's four loads before its first comparison.

A max pool that applies the mask of the ReLU before it (minidnn/fusion.py) runs the same
kernels with `mark` = RELU_MASK_BIT instead of 0: forward sets that bit of the argmax where
the window's maximum is > 0, and backward routes a window's gradient only when the argmax is
its offset with the bit set. The ReLU's output at a window's winner is that window's
maximum, so a value gets the sum of its windows' gradients where the ReLU's output is > 0
and +0 elsewhere: the ReLU backward's selection after the unmasked pool's backward, the same
bits with one pass over the map where the two layers took four. Such a pool may apply the
ReLU's forward too (`rectify`): it reads the ReLU's input and turns each value, as it loads
it, into what the ReLU would have stored (`relu_before`: the bias added, the ReLU's
selection, one rounding), so its comparisons see the bits they saw in the ReLU's output.

bfloat16 maps (mixed precision, kernels/mapformat.py) compute in float32 and round each output
once, as cuda_pointwise's kernels do (its STORAGE_SOURCE: widen, narrow): a kernel on bf16 maps
gives the bits of float_to_bf16(the float32 kernel on bf16_to_float of its inputs), argmax
included (the float32 kernel's first maximum); backward sums each input's gradients in float32
in the order above, then rounds once.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from ..errors import ConfigError, ShapeError
from . import RELU_MASK_BIT, relu_mask_fits
from .cuda_divide import DIVIDE_SOURCE, INDEX_LIMIT, divider
from .cuda_pointwise import ACC_DTYPES, COLUMN_SOURCE, STORAGE_SOURCE, VECTOR_SOURCE, \
    bias_grad, map_ctype, run_columns
from .mapformat import common_layout

# Maps are T (float, double or bf16); every kernel computes in A = acc_t<T>, reading a map
# through widen and writing it through narrow<T>.
_SOURCE = DIVIDE_SOURCE + VECTOR_SOURCE + STORAGE_SOURCE + COLUMN_SOURCE + r"""
__device__ __forceinline__ float minus_inf(float) { return __int_as_float((int)0xff800000u); }
__device__ __forceinline__ double minus_inf(double) {
    return __longlong_as_double((long long)0xfff0000000000000ull);
}

#define GEOMETRY int H, int W, int OH, int OW, int KH, int KW, int SH, int SW, int PH, int PW
// A max pool that applies the ReLU before it in its forward (minidnn/fusion.py,
// pool_relu_forward) reads the ReLU's input: rectify RELU, or RELU_BIAS with bias_addr the
// address of the bias that ReLU adds (acc_t<T>, one per channel); NONE otherwise.
#define RECTIFY unsigned long long bias_addr, int rectify
enum Rectify { NONE = 0, RELU = 1, RELU_BIAS = 2 };

// The bias of channel c a thread adds, read once (0 when it adds none).
template<typename T>
__device__ __forceinline__ acc_t<T> bias_of(unsigned long long bias_addr, int c, int rectify) {
    return rectify == RELU_BIAS ? reinterpret_cast<const acc_t<T>*>(bias_addr)[c] : acc_t<T>(0);
}

// The value the ReLU before the pool stores for x: relu_forward's, and with the bias b
// relu_bias_last's, narrow(max(x + b, 0)) with one rounding, so the pool's window sees the
// bits the two layers' passes leave in the map. x itself when the pool applies no ReLU.
template<typename T>
__device__ __forceinline__ T relu_before(T x, acc_t<T> b, int rectify) {
    if (rectify == NONE) return x;
    const acc_t<T> v = rectify == RELU_BIAS ? widen(x) + b : widen(x);
    return narrow<T>(v > 0 ? v : acc_t<T>(0));
}

// Thread i of a launch of `count` threads works on plane plane0 + i / (rows * cols), at
// (row, col) = divmod(i % (rows * cols), cols) of that plane's grid of threads.
#define LAUNCH long long plane0, unsigned int count, unsigned int plane_mul, \
               unsigned int plane_shift, unsigned int col_mul, unsigned int col_shift

struct Place { long long plane; int row, col; };

__device__ __forceinline__ bool locate(Place& p, unsigned int rows, unsigned int cols, LAUNCH) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return false;
    const unsigned int q = divide(i, plane_mul, plane_shift);
    const unsigned int r = i - q * (rows * cols);
    const unsigned int row = divide(r, col_mul, col_shift);
    p.plane = plane0 + q;
    p.row = (int)row;
    p.col = (int)(r - row * cols);
    return true;
}

// One thread per output element (oh, ow).
template<typename T>
__global__ void maxpool2d_forward(const T* __restrict__ x, T* __restrict__ y,
                                  unsigned char* __restrict__ argmax, GEOMETRY, int mark,
                                  RECTIFY, int C, LAUNCH) {
    Place p;
    if (!locate(p, OH, OW, plane0, count, plane_mul, plane_shift, col_mul, col_shift)) return;
    const int oh = p.row, ow = p.col;
    const acc_t<T> b = bias_of<T>(bias_addr, rectify == RELU_BIAS ? (int)(p.plane % C) : 0,
                                  rectify);
    x += p.plane * H * W;
    const long long o = p.plane * OH * OW + oh * OW + ow;
    const int h0 = oh * SH - PH, w0 = ow * SW - PW;
    // The window's valid part: rows kh0 <= kh < kh1, columns kw0 <= kw < kw1.
    const int kh0 = max(-h0, 0), kh1 = min(KH, H - h0);
    const int kw0 = max(-w0, 0), kw1 = min(KW, W - w0);
    // Window position 0 (padding reads as -inf) starts the search; a later position wins only
    // when strictly greater, as in cpu.py, so ties keep the first and padding never wins.
    typedef acc_t<T> A;
    A best = (h0 >= 0 && h0 < H && w0 >= 0 && w0 < W)
        ? widen(relu_before(x[h0 * W + w0], b, rectify)) : minus_inf(A(0));
    int arg = 0;
    for (int kh = kh0; kh < kh1; ++kh) {
        const T* row = x + (h0 + kh) * W;
        for (int kw = kw0; kw < kw1; ++kw) {
            if (kh == 0 && kw == 0) continue;
            const A v = widen(relu_before(row[w0 + kw], b, rectify));
            if (v > best) { best = v; arg = kh * KW + kw; }
        }
    }
    y[o] = narrow<T>(best);
    argmax[o] = (unsigned char)(arg | (best > 0 ? mark : 0));
}

// Backward threads own cells. Cell (ch, cw) holds the input rows h = ch * SH - PH + dh and
// columns w = cw * SW - PW + dw, 0 <= dh < SH, 0 <= dw < SW, clipped to the input; the first
// cell row and column are CH0 = PH / SH and CW0 = PW / SW. The windows covering row h are
// oh_lo(dh) <= oh <= oh_hi with oh_hi = min(ch, OH - 1) and
// oh_lo(dh) = max(ch - floor((KH - 1 - dh) / SH), 0); with KH - 1 = QH * SH + RH (0 <= RH < SH)
// that floor is QH for dh <= RH and QH - 1 beyond (-1, no window at all, when QH = 0).
#define CELLS int CH0, int CW0, int QH, int RH, int QW, int RW

template<typename T>
__global__ void maxpool2d_backward(const T* __restrict__ gy,
                                   const unsigned char* __restrict__ argmax,
                                   T* __restrict__ gx, GEOMETRY, CELLS, int rows, int cols,
                                   int mark, LAUNCH) {
    Place p;
    if (!locate(p, rows, cols, plane0, count, plane_mul, plane_shift, col_mul, col_shift))
        return;
    gy += p.plane * OH * OW;
    argmax += p.plane * OH * OW;
    gx += p.plane * H * W;
    const int ch = CH0 + p.row, cw = CW0 + p.col;
    const int oh_hi = min(ch, OH - 1), ow_hi = min(cw, OW - 1);
    for (int dh = 0; dh < SH; ++dh) {
        const int h = ch * SH - PH + dh;
        if (h < 0) continue;
        if (h >= H) break;
        const int oh_lo = max(ch - (dh <= RH ? QH : QH - 1), 0);
        for (int dw = 0; dw < SW; ++dw) {
            const int w = cw * SW - PW + dw;
            if (w < 0) continue;
            if (w >= W) break;
            const int ow_lo = max(cw - (dw <= RW ? QW : QW - 1), 0);
            acc_t<T> acc = 0;
            for (int oh = oh_lo; oh <= oh_hi; ++oh) {
                const int kh = h - (oh * SH - PH);
                for (int ow = ow_lo; ow <= ow_hi; ++ow) {
                    const int o = oh * OW + ow;
                    if (argmax[o] == ((kh * KW + (w - (ow * SW - PW))) | mark))
                        acc += widen(gy[o]);
                }
            }
            gx[h * W + w] = narrow<T>(acc);
        }
    }
}

// Rows (or columns) a window starting at s0 averages: [s0, s0 + K) clipped to the padding,
// then, unless padding counts, to the input (PyTorch's divisor rule).
__device__ __forceinline__ int span(int s0, int K, int S, int P, int include_pad) {
    const int e0 = min(s0 + K, S + P);
    return include_pad ? e0 - s0 : min(e0, S) - max(s0, 0);
}

template<typename T>
__global__ void avgpool2d_forward(const T* __restrict__ x, T* __restrict__ y, GEOMETRY,
                                  int include_pad, LAUNCH) {
    Place p;
    if (!locate(p, OH, OW, plane0, count, plane_mul, plane_shift, col_mul, col_shift)) return;
    const int oh = p.row, ow = p.col;
    x += p.plane * H * W;
    const int hs0 = oh * SH - PH, ws0 = ow * SW - PW;
    const int hs = max(hs0, 0), ws = max(ws0, 0);
    const int he = min(hs0 + KH, H), we = min(ws0 + KW, W);
    const int count_ = span(hs0, KH, H, PH, include_pad) * span(ws0, KW, W, PW, include_pad);
    typedef acc_t<T> A;
    A acc = 0;
    for (int h = hs; h < he; ++h)
        for (int w = ws; w < we; ++w) acc += widen(x[h * W + w]);
    y[p.plane * OH * OW + oh * OW + ow] = narrow<T>(count_ > 0 ? acc / (A)count_ : (A)0);
}

template<typename T>
__global__ void avgpool2d_backward(const T* __restrict__ gy, T* __restrict__ gx, GEOMETRY,
                                   int include_pad, CELLS, int rows, int cols, LAUNCH) {
    Place p;
    if (!locate(p, rows, cols, plane0, count, plane_mul, plane_shift, col_mul, col_shift))
        return;
    gy += p.plane * OH * OW;
    gx += p.plane * H * W;
    const int ch = CH0 + p.row, cw = CW0 + p.col;
    const int oh_hi = min(ch, OH - 1), ow_hi = min(cw, OW - 1);
    for (int dh = 0; dh < SH; ++dh) {
        const int h = ch * SH - PH + dh;
        if (h < 0) continue;
        if (h >= H) break;
        const int oh_lo = max(ch - (dh <= RH ? QH : QH - 1), 0);
        for (int dw = 0; dw < SW; ++dw) {
            const int w = cw * SW - PW + dw;
            if (w < 0) continue;
            if (w >= W) break;
            const int ow_lo = max(cw - (dw <= RW ? QW : QW - 1), 0);
            typedef acc_t<T> A;
            A acc = 0;
            for (int oh = oh_lo; oh <= oh_hi; ++oh) {
                const int rows_ = span(oh * SH - PH, KH, H, PH, include_pad);
                for (int ow = ow_lo; ow <= ow_hi; ++ow) {
                    const int count_ = rows_ * span(ow * SW - PW, KW, W, PW, include_pad);
                    if (count_ > 0) acc += widen(gy[oh * OW + ow]) / (A)count_;
                }
            }
            gx[h * W + w] = narrow<T>(acc);
        }
    }
}

// ---- channels last: x (N, H, W, C), y (N, OH, OW, C) in memory; thread i owns value i ----
// A launch is a grid of (blocks over one image's per_image values) x (images): the image is
// blockIdx.y, and a value's (h, w, c) within it come from 32-bit divisions by C and by the
// plane's width, both launch constants (cuda_divide.py).
#define LAST_LAUNCH unsigned int per_image, unsigned int c_mul, unsigned int c_shift, \
                    unsigned int w_mul, unsigned int w_shift
struct Pixel { long long n, index; int h, w, c; };

__device__ __forceinline__ bool pixel_last(Pixel& p, int C, int width, LAST_LAUNCH) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= per_image) return false;
    const unsigned int r = divide(k, c_mul, c_shift);      // pixel within the image
    const unsigned int h = divide(r, w_mul, w_shift);
    p.c = (int)(k - r * C);
    p.w = (int)(r - h * width);
    p.h = (int)h;
    p.n = blockIdx.y;
    p.index = p.n * per_image + k;
    return true;
}

// The windows covering input row h (with padding P, kernel K, stride S, out size O):
// lo <= o <= hi.
__device__ __forceinline__ void covering(int h, int K, int S, int P, int O, int& lo, int& hi) {
    const int hp = h + P;
    hi = min(hp / S, O - 1);
    lo = hp - K + 1 <= 0 ? 0 : (hp - K + S) / S;
}

template<typename T>
__global__ void maxpool2d_forward_last(const T* __restrict__ x, T* __restrict__ y,
                                       unsigned char* __restrict__ argmax, GEOMETRY, int C,
                                       int mark, RECTIFY, LAST_LAUNCH) {
    Pixel p;                                          // (n, oh, ow, c)
    if (!pixel_last(p, C, OW, per_image, c_mul, c_shift, w_mul, w_shift)) return;
    const long long i = p.index;
    const int h0 = p.h * SH - PH, w0 = p.w * SW - PW;
    x += p.n * H * W * C + p.c;
    const int kh0 = max(-h0, 0), kh1 = min(KH, H - h0);
    const int kw0 = max(-w0, 0), kw1 = min(KW, W - w0);
    typedef acc_t<T> A;
    const A b = bias_of<T>(bias_addr, p.c, rectify);
    A best = (h0 >= 0 && h0 < H && w0 >= 0 && w0 < W)
        ? widen(relu_before(x[((long long)h0 * W + w0) * C], b, rectify))
        : minus_inf(A(0));
    int arg = 0;
    for (int kh = kh0; kh < kh1; ++kh) {
        for (int kw = kw0; kw < kw1; ++kw) {
            if (kh == 0 && kw == 0) continue;
            const A v = widen(relu_before(x[((long long)(h0 + kh) * W + (w0 + kw)) * C], b,
                                          rectify));
            if (v > best) { best = v; arg = kh * KW + kw; }
        }
    }
    y[i] = narrow<T>(best);
    argmax[i] = (unsigned char)(arg | (best > 0 ? mark : 0));
}

template<typename T>
__global__ void maxpool2d_backward_last(const T* __restrict__ gy,
                                        const unsigned char* __restrict__ argmax,
                                        T* __restrict__ gx, GEOMETRY, int C, int mark,
                                        LAST_LAUNCH) {
    Pixel p;              // (n, h, w, c)
    if (!pixel_last(p, C, W, per_image, c_mul, c_shift, w_mul, w_shift)) return;
    const long long i = p.index;
    int oh_lo, oh_hi, ow_lo, ow_hi;
    covering(p.h, KH, SH, PH, OH, oh_lo, oh_hi);
    covering(p.w, KW, SW, PW, OW, ow_lo, ow_hi);
    const long long base = p.n * OH * OW * C + p.c;
    acc_t<T> acc = 0;
    for (int oh = oh_lo; oh <= oh_hi; ++oh) {
        const int kh = p.h - (oh * SH - PH);
        for (int ow = ow_lo; ow <= ow_hi; ++ow) {
            const long long o = base + ((long long)oh * OW + ow) * C;
            if (argmax[o] == ((kh * KW + (p.w - (ow * SW - PW))) | mark)) acc += widen(gy[o]);
        }
    }
    gx[i] = narrow<T>(acc);
}

// Windows that tile the input exactly (stride = kernel, no padding, KH * OH = H, KW * OW = W):
// each input value lies in one window, so a thread per window writes its KH x KW gradients
// (gy at the winner, 0 elsewhere), reading gy and argmax once. 0 + g, not g: the gather above
// adds into +0, which turns a -0 gradient into +0; this gives the same bits.
template<typename T>
__global__ void maxpool2d_backward_tiles_last(const T* __restrict__ gy,
                                              const unsigned char* __restrict__ argmax,
                                              T* __restrict__ gx, GEOMETRY, int C,
                                              int mark, LAST_LAUNCH) {
    Pixel p;              // (n, oh, ow, c)
    if (!pixel_last(p, C, OW, per_image, c_mul, c_shift, w_mul, w_shift)) return;
    const acc_t<T> zero = 0;
    const T g = narrow<T>(zero + widen(gy[p.index])), z = narrow<T>(zero);
    const int arg = argmax[p.index];
    T* out = gx + ((p.n * H + (long long)p.h * KH) * W + (long long)p.w * KW) * C + p.c;
    for (int kh = 0; kh < KH; ++kh)
        for (int kw = 0; kw < KW; ++kw)
            out[((long long)kh * W + kw) * C] = ((kh * KW + kw) | mark) == arg ? g : z;
}

template<typename T>
__global__ void avgpool2d_forward_last(const T* __restrict__ x, T* __restrict__ y, GEOMETRY,
                                       int include_pad, int C, LAST_LAUNCH) {
    Pixel p;
    if (!pixel_last(p, C, OW, per_image, c_mul, c_shift, w_mul, w_shift)) return;
    const long long i = p.index;
    x += p.n * H * W * C + p.c;
    const int hs0 = p.h * SH - PH, ws0 = p.w * SW - PW;
    const int hs = max(hs0, 0), ws = max(ws0, 0);
    const int he = min(hs0 + KH, H), we = min(ws0 + KW, W);
    const int count_ = span(hs0, KH, H, PH, include_pad) * span(ws0, KW, W, PW, include_pad);
    typedef acc_t<T> A;
    A acc = 0;
    for (int h = hs; h < he; ++h)
        for (int w = ws; w < we; ++w) acc += widen(x[((long long)h * W + w) * C]);
    y[i] = narrow<T>(count_ > 0 ? acc / (A)count_ : (A)0);
}

template<typename T>
__global__ void avgpool2d_backward_last(const T* __restrict__ gy, T* __restrict__ gx,
                                        GEOMETRY, int include_pad, int C, LAST_LAUNCH) {
    Pixel p;
    if (!pixel_last(p, C, W, per_image, c_mul, c_shift, w_mul, w_shift)) return;
    const long long i = p.index;
    int oh_lo, oh_hi, ow_lo, ow_hi;
    covering(p.h, KH, SH, PH, OH, oh_lo, oh_hi);
    covering(p.w, KW, SW, PW, OW, ow_lo, ow_hi);
    const long long base = p.n * OH * OW * C + p.c;
    typedef acc_t<T> A;
    A acc = 0;
    for (int oh = oh_lo; oh <= oh_hi; ++oh) {
        const int rows_ = span(oh * SH - PH, KH, H, PH, include_pad);
        for (int ow = ow_lo; ow <= ow_hi; ++ow) {
            const int count_ = rows_ * span(ow * SW - PW, KW, W, PW, include_pad);
            if (count_ > 0) acc += widen(gy[base + ((long long)oh * OW + ow) * C]) / (A)count_;
        }
    }
    gx[i] = narrow<T>(acc);
}

// ---- channels last, VEC channels per thread (C % VEC == 0, maps 16-byte aligned) ----
// The kernels above, value for value (the same windows, comparisons and order of sums), but a
// thread moves VEC channels of a pixel with one 16-byte load or store per window position: a
// thread per value kept the H200's max-pool forward at about a third of memory speed. CV is
// C / VEC, the vectors in a pixel; thread k owns values k * VEC ... k * VEC + VEC - 1.
template<typename T, int VEC>
__global__ void maxpool2d_forward_vec(const T* __restrict__ x, T* __restrict__ y,
                                      unsigned char* __restrict__ argmax, GEOMETRY, int CV,
                                      int mark, RECTIFY, LAST_LAUNCH) {
    Pixel p;                                          // (n, oh, ow, vector)
    if (!pixel_last(p, CV, OW, per_image, c_mul, c_shift, w_mul, w_shift)) return;
    const int C = CV * VEC;
    const int h0 = p.h * SH - PH, w0 = p.w * SW - PW;
    x += p.n * H * W * C + p.c * VEC;
    const int kh0 = max(-h0, 0), kh1 = min(KH, H - h0);
    const int kw0 = max(-w0, 0), kw1 = min(KW, W - w0);
    typedef acc_t<T> A;
    A best[VEC];
    unsigned char arg[VEC];
    const bool first = h0 >= 0 && h0 < H && w0 >= 0 && w0 < W;
    const Pack<T, VEC> a0 = first ? load<T, VEC>(x + ((long long)h0 * W + w0) * C, 0)
                                  : Pack<T, VEC>();
    A b[VEC];
    for (int j = 0; j < VEC; ++j) {
        b[j] = bias_of<T>(bias_addr, p.c * VEC + j, rectify);
        best[j] = first ? widen(relu_before(a0.v[j], b[j], rectify)) : minus_inf(A(0));
        arg[j] = 0;
    }
    for (int kh = kh0; kh < kh1; ++kh) {
        for (int kw = kw0; kw < kw1; ++kw) {
            if (kh == 0 && kw == 0) continue;
            const Pack<T, VEC> a = load<T, VEC>(x + ((long long)(h0 + kh) * W + (w0 + kw)) * C, 0);
            for (int j = 0; j < VEC; ++j) {
                const A v = widen(relu_before(a.v[j], b[j], rectify));
                if (v > best[j]) { best[j] = v; arg[j] = (unsigned char)(kh * KW + kw); }
            }
        }
    }
    Pack<T, VEC> out;
    Pack<unsigned char, VEC> args;
    for (int j = 0; j < VEC; ++j) {
        out.v[j] = narrow<T>(best[j]);
        args.v[j] = (unsigned char)(arg[j] | (best[j] > 0 ? mark : 0));
    }
    store<T, VEC>(y + p.index * VEC, 0, out);
    store<unsigned char, VEC>(argmax + p.index * VEC, 0, args);
}

// 2x2 windows that tile the input (stride 2, no padding, 2 * OH = H, 2 * OW = W: VGG's
// pools): the kernel above, value for value, with the four loads of a window issued before
// any comparison, so that they are in flight together (the loop above, with its bounds
// known only at run time, waits for each load before the next).
template<typename T, int VEC>
__global__ void maxpool2d_forward_tiles2_vec(const T* __restrict__ x, T* __restrict__ y,
                                             unsigned char* __restrict__ argmax, GEOMETRY,
                                             int CV, int mark, RECTIFY, LAST_LAUNCH) {
    Pixel p;                                          // (n, oh, ow, vector)
    if (!pixel_last(p, CV, OW, per_image, c_mul, c_shift, w_mul, w_shift)) return;
    const int C = CV * VEC;
    const T* window = x + ((p.n * H + 2LL * p.h) * W + 2LL * p.w) * C + p.c * VEC;
    Pack<T, VEC> a[4];                                // window position kh * 2 + kw
    #pragma unroll
    for (int k = 0; k < 4; ++k)
        a[k] = load<T, VEC>(window + ((long long)(k >> 1) * W + (k & 1)) * C, 0);
    typedef acc_t<T> A;
    Pack<T, VEC> out;
    Pack<unsigned char, VEC> args;
    #pragma unroll
    for (int j = 0; j < VEC; ++j) {
        const A b = bias_of<T>(bias_addr, p.c * VEC + j, rectify);
        A best = widen(relu_before(a[0].v[j], b, rectify));
        int arg = 0;
        #pragma unroll
        for (int k = 1; k < 4; ++k) {
            const A v = widen(relu_before(a[k].v[j], b, rectify));
            if (v > best) { best = v; arg = k; }
        }
        out.v[j] = narrow<T>(best);
        args.v[j] = (unsigned char)(arg | (best > 0 ? mark : 0));
    }
    store<T, VEC>(y + p.index * VEC, 0, out);
    store<unsigned char, VEC>(argmax + p.index * VEC, 0, args);
}

template<typename T, int VEC>
__global__ void maxpool2d_backward_vec(const T* __restrict__ gy,
                                       const unsigned char* __restrict__ argmax,
                                       T* __restrict__ gx, GEOMETRY, int CV, int mark,
                                       LAST_LAUNCH) {
    Pixel p;              // (n, h, w, vector)
    if (!pixel_last(p, CV, W, per_image, c_mul, c_shift, w_mul, w_shift)) return;
    const int C = CV * VEC;
    int oh_lo, oh_hi, ow_lo, ow_hi;
    covering(p.h, KH, SH, PH, OH, oh_lo, oh_hi);
    covering(p.w, KW, SW, PW, OW, ow_lo, ow_hi);
    const long long base = p.n * OH * OW * C + p.c * VEC;
    acc_t<T> acc[VEC];
    for (int j = 0; j < VEC; ++j) acc[j] = 0;
    for (int oh = oh_lo; oh <= oh_hi; ++oh) {
        const int kh = p.h - (oh * SH - PH);
        for (int ow = ow_lo; ow <= ow_hi; ++ow) {
            const long long o = base + ((long long)oh * OW + ow) * C;
            const int at = (kh * KW + (p.w - (ow * SW - PW))) | mark;
            const Pack<unsigned char, VEC> a = load<unsigned char, VEC>(argmax + o, 0);
            const Pack<T, VEC> g = load<T, VEC>(gy + o, 0);
            for (int j = 0; j < VEC; ++j)
                if (a.v[j] == at) acc[j] += widen(g.v[j]);
        }
    }
    Pack<T, VEC> out;
    for (int j = 0; j < VEC; ++j) out.v[j] = narrow<T>(acc[j]);
    store<T, VEC>(gx + p.index * VEC, 0, out);
}

template<typename T, int VEC>
__global__ void maxpool2d_backward_tiles_vec(const T* __restrict__ gy,
                                             const unsigned char* __restrict__ argmax,
                                             T* __restrict__ gx, GEOMETRY, int CV,
                                             int mark, LAST_LAUNCH) {
    Pixel p;              // (n, oh, ow, vector)
    if (!pixel_last(p, CV, OW, per_image, c_mul, c_shift, w_mul, w_shift)) return;
    const int C = CV * VEC;
    const acc_t<T> zero = 0;
    const Pack<T, VEC> g = load<T, VEC>(gy + p.index * VEC, 0);
    const Pack<unsigned char, VEC> a = load<unsigned char, VEC>(argmax + p.index * VEC, 0);
    T* out = gx + ((p.n * H + (long long)p.h * KH) * W + (long long)p.w * KW) * C + p.c * VEC;
    for (int kh = 0; kh < KH; ++kh)
        for (int kw = 0; kw < KW; ++kw) {
            Pack<T, VEC> o;
            for (int j = 0; j < VEC; ++j)
                o.v[j] = ((kh * KW + kw) | mark) == a.v[j] ? narrow<T>(zero + widen(g.v[j]))
                                                           : narrow<T>(zero);
            store<T, VEC>(out + ((long long)kh * W + kw) * C, 0, o);
        }
}

// ---- channels last, 3x3 windows at stride 1 (inception's pool branch), VEC channels of RUN
// neighbouring pixels of a row per thread ----
// The _vec kernels above, value for value (the same windows, comparisons and order of sums),
// but a thread covers RUN outputs (forward) or inputs (backward) along a row, whose windows
// overlap: it loads each of the 3 x (RUN + 2) pixels they span once, a row at a time, instead
// of 9 pixels per output. Rows go in ascending order and within a row columns ascend, so each
// value sees its window positions in the _vec kernels' order. The loops run over constants,
// so the per-pixel state stays in registers. RUN = 16 / VEC: 4 pixels of float32, 2 of bf16.
// Thread (n, row, run, vector): pixel_last over `runs` = ceil(width / RUN) runs per row.
template<typename T, int VEC>
__global__ void maxpool2d_forward_run3_vec(const T* __restrict__ x, T* __restrict__ y,
                                           unsigned char* __restrict__ argmax, GEOMETRY,
                                           int CV, int runs, int mark, RECTIFY, LAST_LAUNCH) {
    const int RUN = 16 / VEC;
    Pixel p;                                          // (n, oh, run, vector)
    if (!pixel_last(p, CV, runs, per_image, c_mul, c_shift, w_mul, w_shift)) return;
    const int C = CV * VEC;
    const int h0 = p.h - PH, ow0 = p.w * RUN;
    const long long image = p.n * H * W * C + p.c * VEC;
    const int kh0 = max(-h0, 0), kh1 = min(3, H - h0);
    typedef acc_t<T> A;
    A best[RUN][VEC];
    unsigned char arg[RUN][VEC];
    A b[VEC];
    #pragma unroll
    for (int v = 0; v < VEC; ++v) b[v] = bias_of<T>(bias_addr, p.c * VEC + v, rectify);
    #pragma unroll
    for (int kh = 0; kh < 3; ++kh) {
        const int h = h0 + kh;
        // Row h at columns ow0 - PW + m (a pixel outside the input is never read).
        Pack<T, VEC> cell[RUN + 2];
        #pragma unroll
        for (int m = 0; m < RUN + 2; ++m) {
            const int w = ow0 - PW + m;
            cell[m] = h >= 0 && h < H && w >= 0 && w < W
                ? load<T, VEC>(x + image + ((long long)h * W + w) * C, 0) : Pack<T, VEC>();
            #pragma unroll
            for (int v = 0; v < VEC; ++v)
                cell[m].v[v] = relu_before(cell[m].v[v], b[v], rectify);
        }
        #pragma unroll
        for (int j = 0; j < RUN; ++j) {
            const int w0 = ow0 + j - PW;
            const int kw0 = max(-w0, 0), kw1 = min(3, W - w0);
            if (kh == 0) {        // window position 0 (padding reads as -inf) starts the search
                const bool first = h0 >= 0 && h0 < H && w0 >= 0 && w0 < W;
                #pragma unroll
                for (int v = 0; v < VEC; ++v) {
                    best[j][v] = first ? widen(cell[j].v[v]) : minus_inf(A(0));
                    arg[j][v] = 0;
                }
            }
            if (kh < kh0 || kh >= kh1) continue;
            #pragma unroll
            for (int kw = 0; kw < 3; ++kw) {
                if ((kh == 0 && kw == 0) || kw < kw0 || kw >= kw1) continue;
                #pragma unroll
                for (int v = 0; v < VEC; ++v) {
                    const A value = widen(cell[j + kw].v[v]);
                    if (value > best[j][v]) {
                        best[j][v] = value;
                        arg[j][v] = (unsigned char)(kh * 3 + kw);
                    }
                }
            }
        }
    }
    #pragma unroll
    for (int j = 0; j < RUN; ++j) {
        const int ow = ow0 + j;
        if (ow >= OW) break;
        Pack<T, VEC> out;
        Pack<unsigned char, VEC> args;
        #pragma unroll
        for (int v = 0; v < VEC; ++v) {
            out.v[v] = narrow<T>(best[j][v]);
            args.v[v] = (unsigned char)(arg[j][v] | (best[j][v] > 0 ? mark : 0));
        }
        const long long o = ((p.n * OH + p.h) * OW + ow) * C + p.c * VEC;
        store<T, VEC>(y + o, 0, out);
        store<unsigned char, VEC>(argmax + o, 0, args);
    }
}

// Input pixel (h, w) lies in the windows oh = h + PH - 2 + r, ow = w + PW - 2 + d (r, d < 3,
// inside the output), at window position (2 - r) * 3 + (2 - d); they are summed with oh, then
// ow, ascending, as maxpool2d_backward_vec sums them.
template<typename T, int VEC>
__global__ void maxpool2d_backward_run3_vec(const T* __restrict__ gy,
                                            const unsigned char* __restrict__ argmax,
                                            T* __restrict__ gx, GEOMETRY, int CV, int runs,
                                            int mark, LAST_LAUNCH) {
    const int RUN = 16 / VEC;
    Pixel p;                                          // (n, h, run, vector)
    if (!pixel_last(p, CV, runs, per_image, c_mul, c_shift, w_mul, w_shift)) return;
    const int C = CV * VEC;
    const int w0 = p.w * RUN;
    const long long image = p.n * OH * OW * C + p.c * VEC;
    acc_t<T> acc[RUN][VEC];
    #pragma unroll
    for (int j = 0; j < RUN; ++j)
        #pragma unroll
        for (int v = 0; v < VEC; ++v) acc[j][v] = 0;
    #pragma unroll
    for (int r = 0; r < 3; ++r) {
        const int oh = p.h + PH - 2 + r;
        if (oh < 0 || oh >= OH) continue;
        // gy and argmax of output row oh at columns w0 + PW - 2 + m.
        Pack<T, VEC> g[RUN + 2];
        Pack<unsigned char, VEC> a[RUN + 2];
        #pragma unroll
        for (int m = 0; m < RUN + 2; ++m) {
            const int ow = w0 + PW - 2 + m;
            const bool inside = ow >= 0 && ow < OW;
            const long long o = image + ((long long)oh * OW + ow) * C;
            g[m] = inside ? load<T, VEC>(gy + o, 0) : Pack<T, VEC>();
            a[m] = inside ? load<unsigned char, VEC>(argmax + o, 0) : Pack<unsigned char, VEC>();
        }
        #pragma unroll
        for (int j = 0; j < RUN; ++j) {
            #pragma unroll
            for (int d = 0; d < 3; ++d) {
                const int ow = w0 + j + PW - 2 + d;
                if (ow < 0 || ow >= OW) continue;
                const int at = ((2 - r) * 3 + (2 - d)) | mark;
                #pragma unroll
                for (int v = 0; v < VEC; ++v)
                    if (a[j + d].v[v] == at) acc[j][v] += widen(g[j + d].v[v]);
            }
        }
    }
    #pragma unroll
    for (int j = 0; j < RUN; ++j) {
        const int w = w0 + j;
        if (w >= W) break;
        Pack<T, VEC> out;
        #pragma unroll
        for (int v = 0; v < VEC; ++v) out.v[v] = narrow<T>(acc[j][v]);
        store<T, VEC>(gx + ((p.n * H + p.h) * W + w) * C + p.c * VEC, 0, out);
    }
}

// ---- channels last, the backward of a max pool that also sums the bias gradient of the
// convolution whose ReLU it masks (minidnn/fusion.py, pool_bias) ----
// gx as maxpool2d_backward_vec makes it (a value gathers, oh then ow ascending, from +0, the
// gradients of the windows it won), but laid over the threads as cuda_pointwise's
// column_pass lays a map: a block's row lane y takes the pixels column_rows gives it, a
// thread VEC adjacent channels; each thread adds up, per channel, the values it writes, and
// store_column_sums adds the lanes in order. So gx has the pool's bits and partial the sums
// column_pass SUMS takes of gx: bias_grad's, bit for bit. A thread finds its first pixel's
// (n, h, w) with divisions and its step's once, then steps with carries (Step). TILES2: 2x2
// windows at stride 2 that tile the input (VGG's): a pixel lies in one window, by shifts;
// then RUN of a thread's pixels at a time load their window's gradient and winner before any
// is added, so that their loads are in flight together (one pixel at a time, bf16 maps ran
// at 1.9 TB/s), and are added in the order of one at a time: the same bits.
struct Step {
    long long n;
    int h, w;
    __device__ Step(long long pixels, int H, int W) {
        const long long plane = (long long)H * W;
        n = pixels / plane;
        h = (int)((pixels - n * plane) / W);
        w = (int)(pixels - n * plane - (long long)h * W);
    }
};

__device__ __forceinline__ void advance(Step& at, const Step& by, int H, int W) {
    at.w += by.w;
    if (at.w >= W) { at.w -= W; ++at.h; }
    at.h += by.h;
    if (at.h >= H) { at.h -= H; ++at.n; }
    at.n += by.n;
}

// Stores a pixel's gradient g, rounded to T, at gx, and adds the stored values to the
// column sums acc: the bias gradient sums what the map holds, as bias_grad would.
template<typename T, int VEC>
__device__ __forceinline__ void store_and_add(const acc_t<T> (&g)[VEC], T* gx,
                                              acc_t<T> (&acc)[VEC]) {
    Pack<T, VEC> out;
    #pragma unroll
    for (int j = 0; j < VEC; ++j) {
        out.v[j] = narrow<T>(g[j]);
        acc[j] += widen(out.v[j]);
    }
    store<T, VEC>(gx, 0, out);
}

template<typename T, int VEC>
__device__ __forceinline__ void route_and_add(const Pack<unsigned char, VEC>& a,
                                              const Pack<T, VEC>& v, int win, T* gx,
                                              acc_t<T> (&acc)[VEC]) {
    acc_t<T> g[VEC];
    #pragma unroll
    for (int j = 0; j < VEC; ++j) {
        g[j] = 0;
        if (a.v[j] == win) g[j] += widen(v.v[j]);
    }
    store_and_add<T, VEC>(g, gx, acc);
}

template<typename T, int VEC, bool TILES2, int RUN>
__global__ void maxpool2d_backward_sums(const T* __restrict__ gy,
                                        const unsigned char* __restrict__ argmax,
                                        T* __restrict__ gx, GEOMETRY, int mark,
                                        acc_t<T>* __restrict__ partial, COLUMN_ROWS) {
    typedef acc_t<T> A;
    const int c0 = (blockIdx.y * blockDim.x + threadIdx.x) * VEC;
    const RowRange rr = column_rows(rows, block_stride, span, row_step);
    A acc[VEC];
    #pragma unroll
    for (int j = 0; j < VEC; ++j) acc[j] = 0;
    if (c0 < C && rr.first < rr.end) {
        Step at(rr.first, H, W);
        const Step by(rr.step, H, W);
        long long r = rr.first;
        if (TILES2 && RUN > 1) {
            for (; r + (RUN - 1) * rr.step < rr.end; r += RUN * rr.step) {
                Pack<unsigned char, VEC> a[RUN];
                Pack<T, VEC> v[RUN];
                int win[RUN];
                #pragma unroll
                for (int q = 0; q < RUN; ++q) {
                    const long long o = (at.n * OH * OW + (long long)(at.h >> 1) * OW
                                         + (at.w >> 1)) * C + c0;
                    win[q] = ((at.h & 1) * KW + (at.w & 1)) | mark;
                    a[q] = load<unsigned char, VEC>(argmax + o, 0);
                    v[q] = load<T, VEC>(gy + o, 0);
                    advance(at, by, H, W);
                }
                #pragma unroll
                for (int q = 0; q < RUN; ++q)
                    route_and_add<T, VEC>(a[q], v[q], win[q], gx + (r + q * rr.step) * C + c0,
                                          acc);
            }
        }
        for (; r < rr.end; r += rr.step, advance(at, by, H, W)) {
            const int h = at.h, w = at.w;
            int oh_lo, oh_hi, ow_lo, ow_hi;
            if (TILES2) {
                oh_lo = oh_hi = h >> 1;
                ow_lo = ow_hi = w >> 1;
            } else {
                covering(h, KH, SH, PH, OH, oh_lo, oh_hi);
                covering(w, KW, SW, PW, OW, ow_lo, ow_hi);
            }
            const long long base = at.n * OH * OW * C + c0;
            A g[VEC];
            #pragma unroll
            for (int j = 0; j < VEC; ++j) g[j] = 0;
            for (int oh = oh_lo; oh <= oh_hi; ++oh) {
                const int kh = TILES2 ? (h & 1) : h - (oh * SH - PH);
                for (int ow = ow_lo; ow <= ow_hi; ++ow) {
                    const int kw = TILES2 ? (w & 1) : w - (ow * SW - PW);
                    const long long o = base + ((long long)oh * OW + ow) * C;
                    const int win = (kh * KW + kw) | mark;
                    const Pack<unsigned char, VEC> a = load<unsigned char, VEC>(argmax + o, 0);
                    const Pack<T, VEC> v = load<T, VEC>(gy + o, 0);
                    #pragma unroll
                    for (int j = 0; j < VEC; ++j)
                        if (a.v[j] == win) g[j] += widen(v.v[j]);
                }
            }
            store_and_add<T, VEC>(g, gx + r * C + c0, acc);
        }
    }
    store_column_sums<A, VEC>(acc, partial, C, c0);
}
"""

_KERNELS = ("maxpool2d_forward", "maxpool2d_backward", "avgpool2d_forward", "avgpool2d_backward",
            "maxpool2d_forward_last", "maxpool2d_backward_last", "maxpool2d_backward_tiles_last",
            "avgpool2d_forward_last", "avgpool2d_backward_last")
_VECTOR_KERNELS = ("maxpool2d_forward_vec", "maxpool2d_forward_tiles2_vec",
                   "maxpool2d_backward_vec", "maxpool2d_backward_tiles_vec",
                   "maxpool2d_forward_run3_vec", "maxpool2d_backward_run3_vec")
_VECTOR_BYTES = 16
# Pixels a thread of the fused pool's backward (maxpool2d_backward_sums, 2x2 tiles) loads
# before it adds them, one of POOL_SUMS_RUNS (the kernel is built for each; 1: one at a time).
# On the H200, VGG-16's five float32 pools: 2.82 ms one at a time, 2.74-2.75 ms in runs of 2
# or 4, 2.81 in runs of 8 (benchmarks/RESULTS.md, the thirty-second wave); a later call, 2.80
# and 2.82 ms in runs of 1 and 4, bf16 2.18 and 2.10 (the thirty-fourth): within a call's spread
# in float32, a little faster in bf16.
POOL_SUMS_RUNS = (1, 4)
POOL_SUMS_RUN = 4
# Maps the vector kernels take, and their values per vector. float64 maps (tests, gradient
# checks) keep the per-value kernels: NVRTC orders a double sum's operands differently in
# the two, and the sign of a NaN made from inf + -inf follows that order.
_VECTOR_WIDTH = {"float": 4, "bf16": 8}
_module = cp.RawModule(code=_SOURCE, name_expressions=[
    *(f"{k}<{t}>" for k in _KERNELS for t in ("float", "double", "bf16")),
    *(f"{k}<{t}, {vec}>" for k in _VECTOR_KERNELS for t, vec in _VECTOR_WIDTH.items()),
    *(f"maxpool2d_backward_sums<{t}, {vec}, {tiles}, {run}>"
      for t, width in _VECTOR_WIDTH.items() for vec in (1, width)
      for tiles, runs in (("false", (1,)), ("true", POOL_SUMS_RUNS)) for run in runs)])

_THREADS = 256
_MAX_THREADS = 2**31 - 1    # threads per launch; larger work runs as several launches of planes


def _check(name: str, arrays, argmax=None) -> tuple:
    """(C type of the maps, their layout 'nchw' or 'nhwc'); raises on anything the kernels
    would misread: another dtype (float32, float64 or bfloat16, one for all), other strides or
    mixed layouts, an argmax that is not uint8."""
    dtype = np.dtype(arrays[0].dtype)
    ctype = map_ctype(dtype)
    if ctype is None or any(np.dtype(a.dtype) != dtype for a in arrays):
        raise TypeError(f"{name}: pooling takes float32, float64 or bfloat16 maps of one "
                        f"dtype, got {[str(a.dtype) for a in arrays]}")
    if argmax is not None:
        if np.dtype(argmax.dtype) != np.uint8:
            raise TypeError(f"{name}: argmax must be uint8, got {argmax.dtype}")
        arrays = (*arrays, argmax)
    return ctype, common_layout(name, arrays)


def _geometry(x_shape, y_shape, spec) -> tuple:
    """(H, W, OH, OW, KH, KW, SH, SW, PH, PW) as int32 kernel arguments."""
    if len(x_shape) != 4 or len(y_shape) != 4 or tuple(x_shape[:2]) != tuple(y_shape[:2]):
        raise ShapeError(f"pooling: expected (N, C, H, W) and (N, C, OH, OW), got {x_shape} "
                         f"and {y_shape}")
    (h, w), (oh, ow) = x_shape[2:], y_shape[2:]
    if h * w >= INDEX_LIMIT or oh * ow >= INDEX_LIMIT:
        raise ConfigError(f"pooling planes of {h}x{w} -> {oh}x{ow} values: each plane must "
                          f"hold fewer than 2**31")
    (kh, kw), (sh, sw), (ph, pw) = spec.kernel, spec.stride, spec.padding
    return tuple(np.int32(v) for v in (h, w, oh, ow, kh, kw, sh, sw, ph, pw))


def _cells(x_shape, spec) -> tuple:
    """(rows, cols, CELLS arguments) of backward's grid of cells over one input plane."""
    h, w = x_shape[2:]
    (kh, kw), (sh, sw), (ph, pw) = spec.kernel, spec.stride, spec.padding
    ch0, cw0 = ph // sh, pw // sw
    rows, cols = (h - 1 + ph) // sh - ch0 + 1, (w - 1 + pw) // sw - cw0 + 1
    qh, rh = divmod(kh - 1, sh)
    qw, rw = divmod(kw - 1, sw)
    return rows, cols, tuple(np.int32(v) for v in (ch0, cw0, qh, rh, qw, rw))


def _launch(name: str, ctype: str, planes: int, rows: int, cols: int, args: tuple) -> None:
    """Runs kernel `name` over planes x rows x cols threads (LAUNCH arguments appended), as few
    launches of whole planes as the 32-bit thread index allows."""
    per_plane = rows * cols
    if planes <= 0 or per_plane <= 0:
        return
    if per_plane >= INDEX_LIMIT:
        raise ConfigError(f"{name}: {rows}x{cols} threads per plane; at most 2**31 - 1 fit")
    kernel = _module.get_function(f"{name}<{ctype}>")
    by_plane, by_col = divider(per_plane), divider(cols)
    step = max(_MAX_THREADS // per_plane, 1)
    for plane0 in range(0, planes, step):
        count = min(step, planes - plane0) * per_plane
        kernel(((count + _THREADS - 1) // _THREADS,), (_THREADS,),
               args + (np.int64(plane0), np.uint32(count), *by_plane, *by_col))


_MAX_IMAGES = 65535         # images per launch: the grid's y dimension

#: Channels-last 3x3 max pooling at stride 1 runs the `_run3_vec` kernels (a thread per run of
#: pixels along a row) on float32 maps where the channels allow vectors; False: the `_vec`
#: kernels, a thread per pixel (the same bits; kept to compare the two). bf16 maps keep the
#: `_vec` kernels: on the H200 (GoogLeNet b256's inception pools) runs took 1.3-1.6x less time
#: than a pixel a thread on float32 maps, but about 1.1x more on bf16 ones.
RUN3_POOLS = True
_RUN3_TYPES = ("float",)


def _vector(ctype: str, channels: int, maps: tuple, argmax) -> int:
    """Channels per thread of the `_vec` kernels: a 16-byte vector of float32 or bf16 values
    when the channels are a multiple of it and every map starts 16-byte aligned (argmax: a
    vector of bytes), else 1."""
    vec = _VECTOR_WIDTH.get(ctype, 1)
    aligned = all(m.data.ptr % _VECTOR_BYTES == 0 for m in maps) and argmax.data.ptr % vec == 0
    return vec if aligned and channels % vec == 0 else 1


def _launch_last(name: str, ctype: str, shape, maps: tuple, args: tuple, vec: int = 1) -> None:
    """Runs channels-last kernel `name` + '_last' with one thread per value of a map of logical
    `shape` (N, C, H, W), or `name` + '_vec' with one thread per `vec` channels of a pixel:
    `maps` (the arrays, image-sliced when a launch cannot take every image), then `args`,
    then the launch's constants."""
    n, c, h, w = (int(d) for d in shape)
    c //= vec
    per_image = c * h * w
    if per_image <= 0 or n <= 0:
        return
    if per_image * vec >= INDEX_LIMIT:
        raise ConfigError(f"pooling: images of {per_image * vec} values; each must hold fewer "
                          f"than 2**31")
    kernel = _module.get_function(f"{name}_last<{ctype}>" if vec == 1 else
                                  f"{name}_vec<{ctype}, {vec}>")
    constants = (np.uint32(per_image), *divider(c), *divider(w))
    for n0 in range(0, n, _MAX_IMAGES):
        images = min(_MAX_IMAGES, n - n0)
        kernel(((per_image + _THREADS - 1) // _THREADS, images), (_THREADS,),
               tuple(m[n0:n0 + images] for m in maps) + args + constants)


def _runs3(spec, vec: int, ctype: str) -> bool:
    """Whether channels-last max pooling runs the `_run3_vec` kernels: 3x3 windows at stride
    1 (any padding), channels in vectors, maps of a type in _RUN3_TYPES."""
    return (RUN3_POOLS and vec > 1 and ctype in _RUN3_TYPES and tuple(spec.kernel) == (3, 3)
            and tuple(spec.stride) == (1, 1))


def _launch_run3(name: str, ctype: str, shape, maps: tuple, geometry: tuple, vec: int,
                 mark, rectify: tuple = ()) -> None:
    """Kernel `name` + '_run3_vec' over a channels-last map of logical `shape` (N, C, rows,
    width): a thread per vector of channels of 16 / vec pixels along a row. rectify: the
    forward's RECTIFY arguments (_rectify)."""
    n, c, rows, width = shape
    runs = -(-int(width) // (16 // vec))          # the kernels' RUN = 16 / VEC pixels
    _launch_last(name + "_run3", ctype, (n, c, rows, runs), maps,
                 geometry + (np.int32(c // vec), np.int32(runs), mark) + rectify, vec)


def _tiles(x_shape, y_shape, spec) -> bool:
    """Whether the windows tile the input: stride = kernel, no padding, and the windows
    cover every row and column (VGG's 2x2 pools)."""
    (h, w), (oh, ow) = x_shape[2:], y_shape[2:]
    return (tuple(spec.stride) == tuple(spec.kernel) and tuple(spec.padding) == (0, 0)
            and spec.kernel[0] * oh == h and spec.kernel[1] * ow == w)


def _mark(name: str, spec, relu: bool) -> np.int32:
    """The kernels' `mark`: RELU_MASK_BIT when the pool applies the mask of the ReLU before
    it (its windows then leave that bit of the argmax free), else 0."""
    kh, kw = spec.kernel
    if kh * kw > 256 or (relu and not relu_mask_fits(spec.kernel)):
        raise ConfigError(f"{name}: a {kh}x{kw} window has more positions than a uint8 argmax "
                          f"can index{' beside the mark of a ReLU mask' if relu else ''}")
    return np.int32(RELU_MASK_BIT if relu else 0)


_NONE, _RELU, _RELU_BIAS = 0, 1, 2      # the kernels' Rectify


def _rectify(x, rectify) -> tuple:
    """The forward kernels' RECTIFY arguments (bias address, flag) for maxpool2d_forward's
    `rectify`, checked: the bias (C,) contiguous in x's accumulation type (float32 beside
    bf16 maps), the stored dtype x's own (the GPU's kernels take bf16 maps as they are)."""
    if rectify is None:
        return (np.uint64(0), np.int32(_NONE))
    bias, stored = rectify
    if stored is not None and np.dtype(stored) != np.dtype(x.dtype):
        raise TypeError(f"maxpool2d_forward: the ReLU's values are stored as {np.dtype(stored)}"
                        f", but the map is {x.dtype}: the GPU's pool reads the stored map")
    if bias is None:
        return (np.uint64(0), np.int32(_RELU))
    acc = ACC_DTYPES[map_ctype(np.dtype(x.dtype))]
    if np.dtype(bias.dtype) != acc or bias.shape != (x.shape[1],) or \
            not bias.flags.c_contiguous:
        raise TypeError(f"maxpool2d_forward: the ReLU's bias must be contiguous {acc} of "
                        f"shape ({x.shape[1]},), got {bias.dtype} {bias.shape}")
    return (np.uint64(bias.data.ptr), np.int32(_RELU_BIAS))


def maxpool2d_forward(x, y, argmax, spec, relu: bool = False, rectify=None) -> None:
    """y = window maxima of x; argmax (uint8) = kh * KW + kw of each window's first maximum,
    | RELU_MASK_BIT where y > 0 when `relu` (the pool applies the ReLU's mask).

    rectify: None, or (bias, stored) when the pool applies the ReLU before it in its forward
    (minidnn/fusion.py, pool_relu_forward): x is that ReLU's input and the windows hold the
    values the ReLU would have stored, max(x + bias, 0) (bias (C,) or None) as relu_forward
    rounds them; stored must be None or x's dtype."""
    mark = _mark("maxpool2d_forward", spec, relu)
    ctype, layout = _check("maxpool2d_forward", (x, y), argmax)
    if argmax.shape != y.shape:
        raise ShapeError(f"maxpool2d_forward: argmax {argmax.shape} must have y's shape {y.shape}")
    geometry = _geometry(x.shape, y.shape, spec)
    rect = _rectify(x, rectify)
    n, c, oh, ow = y.shape
    if layout == "nhwc":
        vec = _vector(ctype, c, (x, y), argmax)
        if _runs3(spec, vec, ctype):
            _launch_run3("maxpool2d_forward", ctype, y.shape, (x, y, argmax), geometry, vec,
                         mark, rect)
            return
        tiles2 = vec > 1 and tuple(spec.kernel) == (2, 2) and _tiles(x.shape, y.shape, spec)
        _launch_last("maxpool2d_forward_tiles2" if tiles2 else "maxpool2d_forward", ctype,
                     y.shape, (x, y, argmax), geometry + (np.int32(c // vec), mark) + rect, vec)
        return
    _launch("maxpool2d_forward", ctype, n * c, oh, ow,
            (x, y, argmax) + geometry + (mark,) + rect + (np.int32(c),))


def maxpool2d_backward(gy, argmax, gx, spec, relu: bool = False, gb=None) -> None:
    """gx = gy routed to each window's winner (summed where windows overlap); overwrites gx.
    relu: argmax marked by maxpool2d_forward(relu=True), and a window's gradient goes to its
    winner only where its maximum was > 0: where the winner, the ReLU's output y, is > 0, so
    gx is what relu_backward's selection makes of the routed gradient, bit for bit (a value
    no window routes to is +0 both ways).

    gb (C,), when given: also the gradient of the bias that ReLU added (minidnn/fusion.py,
    pool_bias), bias_grad(gx, gb)'s bits; on channels-last float32 and bf16 maps in the same
    pass (maxpool2d_backward_sums), elsewhere the two kernels."""
    mark = _mark("maxpool2d_backward", spec, relu)
    ctype, layout = _check("maxpool2d_backward", (gy, gx), argmax)
    if argmax.shape != gy.shape:
        raise ShapeError(f"maxpool2d_backward: argmax {argmax.shape} must have gy's shape "
                         f"{gy.shape}")
    geometry = _geometry(gx.shape, gy.shape, spec)
    n, c = gx.shape[:2]
    if gb is not None:
        if np.dtype(gb.dtype) != ACC_DTYPES[ctype] or gb.shape != (c,) or \
                not gb.flags.c_contiguous:
            raise TypeError(f"maxpool2d_backward: the bias gradient must be contiguous "
                            f"{ACC_DTYPES[ctype]} of shape ({c},), got {gb.dtype} {gb.shape}")
        if layout == "nhwc" and ctype in _VECTOR_WIDTH:
            vec = _vector(ctype, c, (gy, gx), argmax)
            tiles2 = tuple(spec.kernel) == (2, 2) and _tiles(gx.shape, gy.shape, spec)
            kernel = _module.get_function(f"maxpool2d_backward_sums<{ctype}, {vec}, "
                                          f"{'true' if tiles2 else 'false'}, "
                                          f"{POOL_SUMS_RUN if tiles2 else 1}>")
            run_columns(kernel, n * int(gx.shape[2]) * int(gx.shape[3]), c, vec,
                        (gy, argmax, gx) + geometry + (mark,), gb)
            return
        maxpool2d_backward(gy, argmax, gx, spec, relu)
        bias_grad(gx, gb)
        return
    if layout == "nhwc":
        vec = _vector(ctype, c, (gy, gx), argmax)
        args = geometry + (np.int32(c // vec), mark)
        if _runs3(spec, vec, ctype):
            _launch_run3("maxpool2d_backward", ctype, gx.shape, (gy, argmax, gx), geometry, vec,
                         mark)
        elif _tiles(gx.shape, gy.shape, spec):   # a thread per window: reads gy, argmax once
            _launch_last("maxpool2d_backward_tiles", ctype, gy.shape, (gy, argmax, gx), args,
                         vec)
        else:       # one thread per input value, gathering its windows
            _launch_last("maxpool2d_backward", ctype, gx.shape, (gy, argmax, gx), args, vec)
        return
    rows, cols, cells = _cells(gx.shape, spec)
    _launch("maxpool2d_backward", ctype, n * c, rows, cols,
            (gy, argmax, gx) + geometry + cells + (np.int32(rows), np.int32(cols), mark))


def avgpool2d_forward(x, y, spec) -> None:
    """y = window means of x (zero padding; divisor per spec.count_include_pad)."""
    ctype, layout = _check("avgpool2d_forward", (x, y))
    geometry = _geometry(x.shape, y.shape, spec)
    n, c, oh, ow = y.shape
    include = np.int32(bool(spec.count_include_pad))
    if layout == "nhwc":
        _launch_last("avgpool2d_forward", ctype, y.shape, (x, y),
                     geometry + (include, np.int32(c)))
        return
    _launch("avgpool2d_forward", ctype, n * c, oh, ow, (x, y) + geometry + (include,))


def avgpool2d_backward(gy, gx, spec) -> None:
    """gx = each gy / divisor spread over its window; overwrites gx."""
    ctype, layout = _check("avgpool2d_backward", (gy, gx))
    geometry = _geometry(gx.shape, gy.shape, spec)
    n, c = gx.shape[:2]
    include = np.int32(bool(spec.count_include_pad))
    if layout == "nhwc":
        _launch_last("avgpool2d_backward", ctype, gx.shape, (gy, gx),
                     geometry + (include, np.int32(c)))
        return
    rows, cols, cells = _cells(gx.shape, spec)
    _launch("avgpool2d_backward", ctype, n * c, rows, cols,
            (gy, gx) + geometry + (include,) + cells + (np.int32(rows), np.int32(cols)))
