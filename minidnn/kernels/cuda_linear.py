"""A fully connected layer's matrix products on the GPU: CuPy's on float maps, cuBLAS's
GemmEx on bf16 maps (mixed precision).

With float32 or float64 maps the ops are the reference's (kernels/cpu.py, run on CuPy arrays),
so CuPy's matmul and its math mode (configure: TF32 or strict FP32) apply as before.

With bf16 maps (x, y, gy, gx) the weights stay float32. Each product reads a bf16 copy of the
weights (cuda_weights.py) and runs on bf16 tensor cores with float32 sums, as PyTorch's
autocast does:

    y  = round(x @ w16^T + b)      the product in a float32 temporary, the bias added there,
                                   one rounding
    gw = gy^T @ x                  written in float32 straight into w.grad (no rounding)
    gb = sum over N of gy          in float32
    gx = round(gy @ w16)

cuBLAS is column-major: a row-major (R, C) matrix is its column-major (C, R) transpose, so
each product below is stated on the transposes.
"""
from __future__ import annotations

import cupy as cp
import numpy as np
from cupy_backends.cuda.libs import cublas

from . import cpu as _cpu
from .cuda_pointwise import bf16_to_float, float_to_bf16
from .cuda_weights import weights_in
from .mapformat import is_bfloat16

# cudaDataType_t, cublasComputeType_t and cublasGemmAlgo_t values (cublas_api.h, library_types.h)
_R_32F, _R_16BF = 0, 14
_COMPUTE_32F = 68
_GEMM_DEFAULT = -1
_ONE, _ZERO = np.array(1.0, np.float32), np.array(0.0, np.float32)
_CUDA_TYPE = {np.dtype(np.float32): _R_32F}


def _cuda_type(a) -> int:
    return _R_16BF if is_bfloat16(a.dtype) else _CUDA_TYPE[np.dtype(a.dtype)]


def _gemm(trans_a: bool, trans_b: bool, m: int, n: int, k: int, a, lda: int, b, ldb: int,
          c, ldc: int) -> None:
    """Column-major C (m, n) = op(A) (m, k) @ op(B) (k, n), float32 sums; A, B bf16, C bf16 or
    float32; on CuPy's current stream."""
    handle = cp.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cp.cuda.get_current_stream().ptr)
    cublas.gemmEx(handle, int(trans_a), int(trans_b), m, n, k, _ONE.ctypes.data,
                  a.data.ptr, _cuda_type(a), lda, b.data.ptr, _cuda_type(b), ldb,
                  _ZERO.ctypes.data, c.data.ptr, _cuda_type(c), ldc, _COMPUTE_32F,
                  _GEMM_DEFAULT)


def _check(*arrays) -> None:
    for a in arrays:
        if a is not None and not a.flags.c_contiguous:
            raise ValueError(f"linear: expected C-contiguous arrays, got strides {a.strides} "
                             f"for shape {a.shape}")


def linear_forward(x, w, b, y) -> None:
    """y (N, out) = x (N, in) @ w (out, in)^T + b (out,) (b may be None)."""
    if not is_bfloat16(x.dtype):
        _cpu.linear_forward(x, w, b, y)
        return
    _check(x, w, y)
    (n, k), out = x.shape, w.shape[0]
    y32 = cp.empty(y.shape, dtype=np.float32)
    # y^T (out, N) = w16 (in, out)^T @ x^T (in, N)
    _gemm(True, False, out, n, k, weights_in(w, x.dtype), k, x, k, y32, out)
    if b is not None:
        y32 += b
    float_to_bf16(y32, y)


def linear_backward(x, gy, w, gw, gb, gx) -> None:
    """gw (out, in) = gy^T @ x, gb (out,) = gy summed over N, gx (N, in) = gy @ w; gb and gx
    may be None. All three are overwritten."""
    if not is_bfloat16(gy.dtype):
        _cpu.linear_backward(x, gy, w, gw, gb, gx)
        return
    _check(x, gy, w, gw, gx)
    (n, k), out = x.shape, w.shape[0]
    # gw^T (in, out) = x^T (in, N) @ gy (N, out), straight into float32 gw
    _gemm(False, True, k, out, n, x, k, gy, out, gw, k)
    if gb is not None:
        gy32 = cp.empty(gy.shape, dtype=np.float32)
        bf16_to_float(gy, gy32)
        gy32.sum(axis=0, out=gb)
    if gx is not None:
        # gx^T (in, N) = w16^T (in, out) @ gy^T (out, N)
        _gemm(False, False, k, n, out, weights_in(w, gy.dtype), k, gy, out, gx, k)
