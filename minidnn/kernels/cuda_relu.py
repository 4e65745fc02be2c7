"""ReLU forward and backward as single CuPy kernels.

The NumPy-style expressions cost an extra pass each on the GPU (backward builds the boolean
mask `y > 0` as a temporary before the product); these read each operand once and write once,
so they run at memory bandwidth. Both may run in place (y is x, gx is gy).

The `_bits` pair keeps for backward one bit per value instead of the output (1/32 of the
bytes): forward writes y and, per warp, the 32-bit word of the warp's `y > 0` flags (a warp
ballot: thread k of the warp holds bit k, and consecutive threads hold consecutive values, so
the words land in the byte order of NumPy's little-endian packbits); backward reads one bit
per value.
"""
from __future__ import annotations

import cupy as cp

_relu_forward = cp.ElementwiseKernel("T x", "T y", "y = x > (T)0 ? x : (T)0", "minidnn_relu_forward")
_relu_backward = cp.ElementwiseKernel("T y, T gy", "T gx", "gx = y > (T)0 ? gy : (T)0",
                                      "minidnn_relu_backward")


def relu_forward(x, y) -> None:
    """y = max(x, 0). x, y: same shape and dtype, contiguous."""
    _relu_forward(x, y)


def relu_backward(y, gy, gx) -> None:
    """gx = gy where y > 0, else 0."""
    _relu_backward(y, gy, gx)


_BITS_SOURCE = r"""
template<typename T>
__device__ void forward_bits(const T* x, T* y, unsigned int* mask, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    T v = i < n ? x[i] : (T)0;
    bool positive = v > (T)0;
    unsigned int word = __ballot_sync(0xffffffffu, positive);   // every lane takes part
    if (i < n) {
        y[i] = positive ? v : (T)0;
        if ((threadIdx.x & 31) == 0) mask[i >> 5] = word;
    }
}

template<typename T>
__device__ void backward_bits(const unsigned int* mask, const T* gy, T* gx, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) gx[i] = ((mask[i >> 5] >> (i & 31)) & 1u) ? gy[i] : (T)0;
}

extern "C" {
__global__ void relu_forward_bits_f32(const float* x, float* y, unsigned int* m, long long n)
{ forward_bits<float>(x, y, m, n); }
__global__ void relu_forward_bits_f64(const double* x, double* y, unsigned int* m, long long n)
{ forward_bits<double>(x, y, m, n); }
__global__ void relu_backward_bits_f32(const unsigned int* m, const float* gy, float* gx, long long n)
{ backward_bits<float>(m, gy, gx, n); }
__global__ void relu_backward_bits_f64(const unsigned int* m, const double* gy, double* gx, long long n)
{ backward_bits<double>(m, gy, gx, n); }
}
"""
_bits_module = cp.RawModule(code=_BITS_SOURCE)
_THREADS = 256                      # a multiple of 32: warps never straddle blocks


def _suffix(dtype) -> str:
    if dtype == cp.float32:
        return "f32"
    if dtype == cp.float64:
        return "f64"
    raise TypeError(f"ReLU bit masks support float32 and float64, got {dtype}")


def _launch(name: str, n: int, args) -> None:
    if n:
        kernel = _bits_module.get_function(name)
        kernel(((n + _THREADS - 1) // _THREADS,), (_THREADS,), args)


def relu_forward_bits(x, y, mask) -> None:
    """y = max(x, 0) and mask (uint8, relu_mask_bytes(x.size), 4-byte aligned) = bits of y > 0."""
    _launch(f"relu_forward_bits_{_suffix(x.dtype)}", x.size, (x, y, mask, cp.int64(x.size)))


def relu_backward_bits(mask, gy, gx) -> None:
    """gx = gy where the mask's bit is set, else 0; gx may be gy itself."""
    _launch(f"relu_backward_bits_{_suffix(gy.dtype)}", gy.size, (mask, gy, gx, cp.int64(gy.size)))
