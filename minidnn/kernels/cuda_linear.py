"""A fully connected layer's matrix products on the GPU: cuBLAS's GemmEx on float32 and bf16
maps (mixed precision), CuPy's matmul on float64 ones.

With float32 maps each product is one GemmEx in the math mode kernels/cuda.configure sets
(TF32 or strict FP32 sums, as CuPy's matmul would compute them). GemmEx is called through
ctypes, on the cuBLAS library and handle CuPy loaded, rather than through CuPy: CuPy's cuBLAS
functions rebind the handle's stream on every call and refuse to while a stream is captured
into a CUDA graph (minidnn/step_graph.py). Here the handle is rebound only when the stream
changes, which never happens inside a captured step. The bias's gradient is summed over the
rows by cuda_pointwise.column_totals. float64 maps take the reference's ops (kernels/cpu.py,
on CuPy).

With bf16 maps (x, y, gy, gx) the weights stay float32. Each product reads a bf16 copy of the
weights (cuda_weights.py) and runs on bf16 tensor cores with float32 sums, as PyTorch's
autocast does:

    y  = round(x @ w16^T + b)      the product in a float32 temporary, the bias added there,
                                   one rounding
    gw = gy^T @ x                  written in float32 straight into w.grad (no rounding)
    gb = sum over N of gy          in float32, row after row (NumPy's order), no float32 copy
    gx = round(gy @ w16)

cuBLAS is column-major: a row-major (R, C) matrix is its column-major (C, R) transpose, so
each product below is stated on the transposes.
"""
from __future__ import annotations

import ctypes
import os

import cupy as cp
import numpy as np

from . import cpu as _cpu
from .cuda_pointwise import column_totals, float_to_bf16
from .cuda_weights import weights_in
from .mapformat import is_bfloat16

# cudaDataType_t, cublasComputeType_t and cublasGemmAlgo_t values (cublas_api.h, library_types.h)
_R_32F, _R_16BF = 0, 14
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32 = 68, 77
_GEMM_DEFAULT = -1
_ONE, _ZERO = np.array(1.0, np.float32), np.array(0.0, np.float32)
_CUDA_TYPE = {np.dtype(np.float32): _R_32F}


# The compute type of float32 products, as kernels/cuda sets it: from its import on, in the
# math mode in force there (TF32 until configure says otherwise, as for the convolutions).
_float32_compute = {"type": _COMPUTE_32F}


def set_math(math: str) -> None:
    """'tf32' or 'fp32': how float32 products sum (kernels/cuda.configure decides)."""
    _float32_compute["type"] = _COMPUTE_32F_FAST_TF32 if math == "tf32" else _COMPUTE_32F


def _cuda_type(a) -> int:
    return _R_16BF if is_bfloat16(a.dtype) else _CUDA_TYPE[np.dtype(a.dtype)]


_library: list = []     # the ctypes handle of the cuBLAS library CuPy loaded, once found


def _cublas():
    """The cuBLAS library CuPy loaded, as a ctypes library (the same copy, so CuPy's handles
    are its handles): found among the process's mapped files."""
    if not _library:
        cp.cuda.device.get_cublas_handle()          # makes CuPy load it
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcublas.so" in line}
        paths = [p for p in paths if os.path.basename(p).startswith("libcublas.so")]
        if not paths:
            raise RuntimeError("cuBLAS: CuPy's libcublas.so is not among the loaded libraries")
        lib = ctypes.CDLL(sorted(paths)[0])
        lib.cublasGemmEx.argtypes = [ctypes.c_void_p] + [ctypes.c_int] * 5 + \
            [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
             ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
             ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.cublasSetStream_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.cublasGetStream_v2.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        _library.append(lib)
    return _library[0]


def bind_stream(stream_ptr: int) -> None:
    """Bind CuPy's cuBLAS handle to a stream (before a step is captured: see above)."""
    lib, handle = _cublas(), cp.cuda.device.get_cublas_handle()
    current = ctypes.c_void_p()
    _status(lib.cublasGetStream_v2(handle, ctypes.byref(current)), "cublasGetStream")
    if (current.value or 0) != stream_ptr:
        _status(lib.cublasSetStream_v2(handle, stream_ptr), "cublasSetStream")


def _status(code: int, what: str) -> None:
    if code != 0:
        raise RuntimeError(f"{what} failed with cuBLAS status {code}")


def _gemm(trans_a: bool, trans_b: bool, m: int, n: int, k: int, a, b, c,
          add: bool = False) -> None:
    """Column-major C (m, n) = op(A) (m, k) @ op(B) (k, n), float32 sums; A, B bf16 (C bf16 or
    float32) or all float32 (summed as set_math says); on CuPy's current stream. add: C +=
    the product instead (cuBLAS's beta = 1: C is read in the product's epilogue, and the
    float32 product is added to it there).

    a, b, c: C-contiguous 2-D arrays, which cuBLAS reads as column-major matrices of their
    transposed shape: each one's leading dimension is its last axis."""
    bind_stream(cp.cuda.get_current_stream().ptr)
    compute = _float32_compute["type"] if a.dtype == np.float32 else _COMPUTE_32F
    _status(_cublas().cublasGemmEx(
        cp.cuda.device.get_cublas_handle(), int(trans_a), int(trans_b), m, n, k,
        _ONE.ctypes.data, a.data.ptr, _cuda_type(a), a.shape[-1], b.data.ptr, _cuda_type(b),
        b.shape[-1], (_ONE if add else _ZERO).ctypes.data, c.data.ptr, _cuda_type(c),
        c.shape[-1], compute, _GEMM_DEFAULT), "cublasGemmEx")


def _check(*arrays) -> None:
    for a in arrays:
        if a is not None and not a.flags.c_contiguous:
            raise ValueError(f"linear: expected C-contiguous arrays, got strides {a.strides} "
                             f"for shape {a.shape}")


def _dense(*arrays) -> bool:
    """True when every array given (None aside) is C-contiguous: what GemmEx is called on."""
    return all(a is None or a.flags.c_contiguous for a in arrays)


def linear_forward(x, w, b, y, y32=None) -> None:
    """y (N, out) = x (N, in) @ w (out, in)^T + b (out,) (b may be None). With bf16 maps the
    product goes to y32, a float32 (N, out) buffer (None: one is allocated), the bias is
    added there and y is its rounding."""
    if x.dtype == np.float32 and _dense(x, w, y):
        (n, k), out = x.shape, w.shape[0]
        _gemm(True, False, out, n, k, w, x, y)     # as below, with w itself
        if b is not None:
            y += b
        return
    if not is_bfloat16(x.dtype):
        _cpu.linear_forward(x, w, b, y)
        return
    _check(x, w, y)
    (n, k), out = x.shape, w.shape[0]
    if y32 is None:
        y32 = cp.empty(y.shape, dtype=np.float32)
    _check(y32)
    # y^T (out, N) = w16 (in, out)^T @ x^T (in, N)
    _gemm(True, False, out, n, k, weights_in(w, x.dtype), x, y32)
    if b is not None:
        y32 += b
    float_to_bf16(y32, y)


def linear_backward(x, gy, w, gw, gb, gx, add: bool = False) -> None:
    """gw (out, in) = gy^T @ x, gb (out,) = gy summed over N, gx (N, in) = gy @ w; gw, gb and
    gx may be None (minidnn/gathered.py computes a weight's gradient apart). All three are
    overwritten, but gw under `add`: gw += gy^T @ x in the product's epilogue (a
    micro-batch after a step's first: no temporary, and one pass over gw where a product
    into a temporary and an add took three). cuBLAS may then run another kernel than for the
    plain product, so the sum agrees with the product added afterwards within float32
    rounding, not necessarily bit for bit. Maps GemmEx does not
    take go to the reference (kernels/cpu.py), whose add takes a temporary."""
    wide = gy.dtype == np.float32
    if not (is_bfloat16(gy.dtype) or wide and _dense(x, gy, w, gw, gx)):
        _cpu.linear_backward(x, gy, w, gw, gb, gx, add)
        return
    _check(x, gy, w, gw, gx)
    (n, k), out = x.shape, w.shape[0]
    # gw^T (in, out) = x^T (in, N) @ gy (N, out), straight into float32 gw
    if gw is not None:
        _gemm(False, True, k, out, n, x, gy, gw, add)
    if wide:
        if gb is not None:
            column_totals(gy, gb)
        if gx is not None:
            _gemm(False, False, k, n, out, w, gy, gx)
        return
    if gb is not None:
        column_sums(gy, gb)
    if gx is not None:
        # gx^T (in, N) = w16^T (in, out) @ gy^T (out, N)
        _gemm(False, False, k, n, out, weights_in(w, gy.dtype), gy, gx)


_COLUMN_SUMS = cp.RawKernel(r"""
extern "C" __global__ void bf16_column_sums(const unsigned short* g, float* out,
                                            long long rows, int cols) {
    // One thread per column: the rows summed in order, as NumPy sums axis 0 of (rows, cols).
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    float s = __uint_as_float((unsigned int)g[j] << 16);
    for (long long r = 1; r < rows; ++r)
        s += __uint_as_float((unsigned int)g[r * cols + j] << 16);
    out[j] = s;
}
""", "bf16_column_sums")


def column_sums(g, out) -> None:
    """out (cols,) float32 = g (rows, cols) bf16, C-contiguous, summed over its rows in float32,
    row after row: the bits of NumPy's sum over axis 0 of g widened, with no widened copy."""
    _check(g, out)
    rows, cols = g.shape
    if out.dtype != np.float32 or out.shape != (cols,):
        raise ValueError(f"column_sums: out must be float32 of shape ({cols},), got "
                         f"{out.dtype} {out.shape}")
    threads = 128
    _COLUMN_SUMS(((cols + threads - 1) // threads,), (threads,),
                 (g.view(np.uint16), out, np.int64(rows), np.int32(cols)))
