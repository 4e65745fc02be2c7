"""Pointwise passes over feature maps at memory speed: ReLU (with or without a bit mask) and
the convolution's bias add, as CuPy raw kernels.

Each of these reads and writes every value once, so only memory bandwidth bounds them. Two
things get them there (CuPy's ElementwiseKernel reached about a third of it on large maps):
* A thread moves one 16-byte vector (4 floats or 2 doubles) per load and store, when every
  array starts 16-byte aligned and the size allows; otherwise one value (the same code with
  a vector of one).
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
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from ..backend import same_memory
from .cuda_divide import DIVIDE_SOURCE, INDEX_LIMIT, divider
from .mapformat import common_layout, in_memory_order, is_channels_last, pixel_rows

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

_SOURCE = DIVIDE_SOURCE + VECTOR_SOURCE + r"""
// Thread k of a launch owns values k * VEC ... k * VEC + VEC - 1; n is a multiple of VEC.

template<typename T, int VEC>
__global__ void relu_forward(const T* x, T* y, unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    Pack<T, VEC> a = load<T, VEC>(x, k);
    #pragma unroll
    for (int j = 0; j < VEC; ++j) a.v[j] = a.v[j] > (T)0 ? a.v[j] : (T)0;
    store<T, VEC>(y, k, a);
}

template<typename T, int VEC>
__global__ void relu_backward(const T* y, const T* gy, T* gx, unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    const Pack<T, VEC> out = load<T, VEC>(y, k);
    Pack<T, VEC> g = load<T, VEC>(gy, k);
    #pragma unroll
    for (int j = 0; j < VEC; ++j) g.v[j] = out.v[j] > (T)0 ? g.v[j] : (T)0;
    store<T, VEC>(gx, k, g);
}

template<typename T, int VEC>
__global__ void add(const T* a, const T* b, T* out, unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    Pack<T, VEC> x = load<T, VEC>(a, k);
    const Pack<T, VEC> y = load<T, VEC>(b, k);
    #pragma unroll
    for (int j = 0; j < VEC; ++j) x.v[j] += y.v[j];
    store<T, VEC>(out, k, x);
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
            const bool positive = a.v[j] > (T)0;
            bits |= (unsigned int)positive << j;
            a.v[j] = positive ? a.v[j] : (T)0;
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
    for (int j = 0; j < VEC; ++j) g.v[j] = (bits >> j) & 1u ? g.v[j] : (T)0;
    store<T, VEC>(gx, k, g);
}

// y (planes of hw values; plane p has channel (p % C)) += b[channel]. The launch starts at a
// plane whose channel is c0; hw is a multiple of VEC, so a vector never straddles planes.
template<typename T, int VEC>
__global__ void bias_add(T* y, const T* b, unsigned int c0, unsigned int C,
                         unsigned int hw_mul, unsigned int hw_shift, unsigned int c_mul,
                         unsigned int c_shift, unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    const unsigned int plane = c0 + divide(k * VEC, hw_mul, hw_shift);
    const T bias = b[plane - divide(plane, c_mul, c_shift) * C];
    Pack<T, VEC> a = load<T, VEC>(y, k);
    #pragma unroll
    for (int j = 0; j < VEC; ++j) a.v[j] += bias;
    store<T, VEC>(y, k, a);
}

// Channels last: y (pixels of C values) += b. The launch starts at a pixel boundary; C is a
// multiple of VEC, so a vector never straddles pixels and its first value's channel is
// (k * VEC) mod C.
template<typename T, int VEC>
__global__ void bias_add_last(T* y, const T* b, unsigned int C, unsigned int c_mul,
                              unsigned int c_shift, unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    const unsigned int first = k * VEC;
    const unsigned int c = first - divide(first, c_mul, c_shift) * C;
    Pack<T, VEC> a = load<T, VEC>(y, k);
    #pragma unroll
    for (int j = 0; j < VEC; ++j) a.v[j] += b[c + j];
    store<T, VEC>(y, k, a);
}

// Channels last, with a convolution's bias added first (minidnn/fusion.py): y = max(x + b, 0)
// over (pixels, C) in memory; the launch starts at a pixel boundary and C is a multiple of
// VEC. The same two float operations as bias_add_last then relu_forward: the same bits.
template<typename T, int VEC>
__global__ void relu_bias_last(const T* x, T* y, const T* b, unsigned int C,
                               unsigned int c_mul, unsigned int c_shift, unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n / VEC) return;
    const unsigned int first = k * VEC;
    const unsigned int c = first - divide(first, c_mul, c_shift) * C;
    Pack<T, VEC> a = load<T, VEC>(x, k);
    #pragma unroll
    for (int j = 0; j < VEC; ++j) {
        const T v = a.v[j] + b[c + j];
        a.v[j] = v > (T)0 ? v : (T)0;
    }
    store<T, VEC>(y, k, a);
}

// The same with relu_forward_bits' mask (the launch starts at a multiple of 32 values).
template<typename T, int VEC>
__global__ void relu_bias_bits_last(const T* x, T* y, unsigned int* mask, const T* b,
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
            const T v = a.v[j] + b[c + j];
            const bool positive = v > (T)0;
            bits |= (unsigned int)positive << j;
            a.v[j] = positive ? v : (T)0;
        }
        store<T, VEC>(y, k, a);
    }
    bits <<= VEC * (k % LANES);
    #pragma unroll
    for (int offset = LANES / 2; offset > 0; offset /= 2)
        bits |= __shfl_xor_sync(0xffffffffu, bits, offset);
    if (active && k % LANES == 0) mask[k / LANES] = bits;
}

// Channels last: partial[blockIdx.x, c] = sum of g[r, c] over the rows r of this block's
// share (rows of C values). A block is 32 columns x 8 row lanes; each thread sums every 8th
// row of its share in order, then the 8 lanes are added in a fixed order: deterministic.
template<typename T>
__device__ __forceinline__ void store_column_partial(T acc, T* partial, int c, int C) {
    __shared__ T lanes[8][32];
    lanes[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        T sum = 0;
        #pragma unroll
        for (int j = 0; j < 8; ++j) sum += lanes[j][threadIdx.x];
        partial[blockIdx.x * (long long)C + c] = sum;
    }
}

template<typename T>
__global__ void column_sums(const T* __restrict__ g, T* __restrict__ partial, long long rows,
                            int C, long long rows_per_block) {
    const int c = blockIdx.y * 32 + threadIdx.x;
    const long long r0 = blockIdx.x * rows_per_block;
    const long long r1 = min(r0 + rows_per_block, rows);
    T acc = 0;
    if (c < C)
        for (long long r = r0 + threadIdx.y; r < r1; r += 8) acc += g[r * C + c];
    store_column_partial(acc, partial, c, C);
}

// relu_backward and then column_sums of its result in one pass (the gradient of the bias
// this ReLU added: minidnn/fusion.py): each value is written as relu_backward writes it and
// added in column_sums' order, so both results have the same bits as the two passes. gx may
// be gy (each value is read, then written, by one thread).
template<typename T>
__global__ void relu_backward_sums(const T* y, const T* gy, T* gx, T* __restrict__ partial,
                                   long long rows, int C, long long rows_per_block) {
    const int c = blockIdx.y * 32 + threadIdx.x;
    const long long r0 = blockIdx.x * rows_per_block;
    const long long r1 = min(r0 + rows_per_block, rows);
    T acc = 0;
    if (c < C) {
        #pragma unroll 4
        for (long long r = r0 + threadIdx.y; r < r1; r += 8) {
            const long long i = r * C + c;
            const T g = y[i] > (T)0 ? gy[i] : (T)0;
            gx[i] = g;
            acc += g;
        }
    }
    store_column_partial(acc, partial, c, C);
}

// The same with relu_forward_bits' mask in place of the output (value i: bit i % 32 of
// word i / 32).
template<typename T>
__global__ void relu_backward_bits_sums(const T* gy, T* gx, const unsigned int* mask,
                                        T* __restrict__ partial, long long rows, int C,
                                        long long rows_per_block) {
    const int c = blockIdx.y * 32 + threadIdx.x;
    const long long r0 = blockIdx.x * rows_per_block;
    const long long r1 = min(r0 + rows_per_block, rows);
    T acc = 0;
    if (c < C) {
        #pragma unroll 4
        for (long long r = r0 + threadIdx.y; r < r1; r += 8) {
            const long long i = r * C + c;
            const T g = (mask[i >> 5] >> (i & 31)) & 1u ? gy[i] : (T)0;
            gx[i] = g;
            acc += g;
        }
    }
    store_column_partial(acc, partial, c, C);
}
"""

_KERNELS = ("add", "relu_forward", "relu_backward", "relu_forward_bits", "relu_backward_bits",
            "bias_add", "bias_add_last", "relu_bias_last", "relu_bias_bits_last")
_COLUMN_KERNELS = ("column_sums", "relu_backward_sums", "relu_backward_bits_sums")

# bfloat16 <-> float32 on the raw 16-bit patterns (bf16 is the top half of a float32):
# rounding to nearest even adds 0x7fff plus the kept half's lowest bit before truncating;
# a NaN stays a (quiet) NaN of the same sign.
_BF16_SOURCE = r"""
extern "C" __global__ void float_to_bf16(const float* x, unsigned short* y, unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    const unsigned int u = __float_as_uint(x[k]);
    y[k] = (u & 0x7fffffffu) > 0x7f800000u
        ? (unsigned short)((u >> 16) | 0x40u)
        : (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

extern "C" __global__ void bf16_to_float(const unsigned short* x, float* y, unsigned int n) {
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    y[k] = __uint_as_float((unsigned int)x[k] << 16);
}
"""
_CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_VECTOR_BYTES = 16


def _instances():
    for ctype, size in (("float", 4), ("double", 8)):
        for vec in (1, _VECTOR_BYTES // size):
            for name in _KERNELS:
                yield f"{name}<{ctype}, {vec}>"
        for name in _COLUMN_KERNELS:
            yield f"{name}<{ctype}>"


_module = cp.RawModule(code=_SOURCE, name_expressions=list(_instances()))
_bf16_module = cp.RawModule(code=_BF16_SOURCE)

_THREADS = 256          # a multiple of 32: warps never straddle blocks
#: Values per launch; larger arrays run as several launches of this many (a multiple of every
#: vector width and of 32, so the pieces keep the vectors and the mask words whole). The bias
#: add keeps each piece's operands below 2**31 by the same bound.
_CHUNK = 2**30


def _ctype(name: str, arrays) -> str:
    """The C type of the float arrays (one dtype, float32 or float64); raises on anything the
    kernels would misread: another dtype, a strided array, mismatched sizes."""
    dtype = np.dtype(arrays[0].dtype)
    ctype = _CTYPES.get(dtype)
    if ctype is None or any(np.dtype(a.dtype) != dtype for a in arrays):
        raise TypeError(f"{name}: takes float32 or float64 arrays of one dtype, got "
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


def _flat_pass(name: str, arrays, mask=None) -> None:
    """Kernel `name` over the values of `arrays` (one shape, dense in one layout) in memory
    order, and the words of a ReLU mask after them when given, in launches of at most _CHUNK
    values."""
    if any(a.shape != arrays[0].shape for a in arrays):
        raise ValueError(f"{name}: arrays of shapes {[a.shape for a in arrays]}")
    common_layout(name, arrays)
    flat = [in_memory_order(a) for a in arrays]
    ctype = _ctype(name, flat)
    n = flat[0].size
    words = () if mask is None else (_words(mask, n),)
    vec = _vector(flat, n)
    for s, e in _pieces(n):
        _run(name, ctype, vec, e - s,
             tuple(a[s:e] for a in flat) + tuple(w[s // 32:] for w in words))


def add(a, b, out) -> None:
    """out = a + b, value by value; out may be a or b. Arrays of one shape, dense in one
    layout (NCHW or channels last), float32 or float64: one vectorized pass in memory order
    (CuPy's own add reached about 70% of memory speed on ResNet-50's maps). Anything else
    goes to CuPy's add."""
    try:
        _flat_pass("add", (a, b, out))
    except (TypeError, ValueError):
        cp.add(a, b, out=out)


def relu_forward(x, y, bias=None) -> None:
    """y = max(x + bias, 0) (bias (C,) along axis 1 when given: a convolution's, moved here by
    minidnn/fusion.py). x, y: same shape and dtype, contiguous; y may be x."""
    if bias is None:
        _flat_pass("relu_forward", (x, y))
    else:
        _relu_bias(x, y, bias, None)


def relu_backward(y, gy, gx, gb=None) -> None:
    """gx = gy where y > 0, else 0; gx may be gy. gb (C,), when given: also the gradient of
    the bias this ReLU added (minidnn/fusion.py), bias_grad(gx, gb), in the same pass on
    channels-last maps."""
    if gb is not None and _column_pass("relu_backward_sums", (y, gy, gx), gb):
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
    if gb is not None and _column_pass("relu_backward_bits_sums", (gy, gx), gb, mask):
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
    ctype = _ctype("bias_add", (y2,))
    if b.dtype != y2.dtype or b.shape != (y2.shape[1],) or not b.flags.c_contiguous:
        raise ValueError(f"bias_add: b must be contiguous {y2.dtype} of shape ({y2.shape[1]},), "
                         f"got {b.dtype} {b.shape}")
    return ctype


#: Blocks of column_sums per 32 channels: enough to fill the GPU, few enough that their
#: partial sums are a small temporary.
_SUM_BLOCKS = 2048


def bias_grad(gy, gb) -> None:
    """gb (C,) = sum of gy (N, C, H, W) over N, H and W (a convolution's bias gradient).
    Channels last: column sums in a fixed order (channel_sums). NCHW: summing each (n, c) row
    first reduces contiguous memory; reducing over axes (0, 2, 3) at once gives CuPy one
    thread block per channel, far too few to reach memory speed on large maps."""
    if _column_pass("column_sums", (gy,), gb):
        return
    n, c = gy.shape[:2]
    rows = gy.reshape(n, c, -1).sum(axis=2)          # (N, C), a small temporary
    rows.sum(axis=0, out=gb)


def channel_sums(g, out) -> None:
    """out (C,) = sum of g (N, C, H, W), channels last, over N, H and W (the bias gradient),
    in a fixed order. Per-block partial sums (a small temporary), then their sum."""
    if not _column_pass("column_sums", (g,), out):
        raise ValueError(f"channel_sums: takes a channels-last map, got strides {g.strides}")


def _column_pass(name: str, maps, out, mask=None) -> bool:
    """Kernel `name` of the column_sums family over channels-last maps (N, C, H, W) seen as
    (pixels, C) matrices, then out (C,) = the sum of its per-block partial sums. False (and
    nothing done) where the maps are not channels last."""
    if any(m.flags.c_contiguous or not is_channels_last(m) for m in maps):
        return False
    rows2 = [pixel_rows(m) for m in maps]
    ctype = _ctype(name, rows2)
    rows, channels = rows2[0].shape
    words = () if mask is None else (_words(mask, rows2[0].size),)
    per_block = max(-(-rows // _SUM_BLOCKS), 1)
    blocks = max(-(-rows // per_block), 1)
    partial = cp.empty((blocks, channels), dtype=rows2[0].dtype)
    kernel = _module.get_function(f"{name}<{ctype}>")
    kernel((blocks, -(-channels // 32)), (32, 8),
           (*rows2, *words, partial, np.int64(rows), np.int32(channels), np.int64(per_block)))
    partial.sum(axis=0, out=out)
    return True


def _convert(name: str, src, dst, src_bits, dst_bits) -> None:
    """Kernel `name` from src to dst (one shape, one dense layout), as raw words."""
    if src.shape != dst.shape:
        raise ValueError(f"{name}: shapes {src.shape} and {dst.shape}")
    common_layout(name, (src, dst))
    a = in_memory_order(src).view(src_bits)
    b = in_memory_order(dst).view(dst_bits)
    kernel = _bf16_module.get_function(name)
    for s, e in _pieces(a.size):
        n = e - s
        kernel(((n + _THREADS - 1) // _THREADS,), (_THREADS,), (a[s:e], b[s:e], np.uint32(n)))


def float_to_bf16(src, dst) -> None:
    """dst (bfloat16) = src (float32) rounded to nearest even, as ml_dtypes rounds."""
    _convert("float_to_bf16", src, dst, np.float32, np.uint16)


def bf16_to_float(src, dst) -> None:
    """dst (float32) = src (bfloat16), exactly."""
    _convert("bf16_to_float", src, dst, np.uint16, np.float32)
