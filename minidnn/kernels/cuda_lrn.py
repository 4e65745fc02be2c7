"""Local response normalization across channels on the GPU, as CuPy raw kernels.

PyTorch's LocalResponseNorm, as cpu.py: for channel c the window is c - size//2 ..
c + (size-1)//2 (zero outside), scale = k + alpha/size * sum of x**2 over it, y = x * scale**-beta.
Backward sums, for each input value, over the windows that contain it (the mirror image of its
own window), so it needs no atomics and is deterministic:

    gx_c = gy_c * s_c**-beta - 2 alpha beta / size * x_c * sum_{j: c in window(j)} q_j,
    q_j = gy_j * x_j * s_j**-beta / s_j

A thread owns a run of RUN consecutive channels at one position (a pixel of an image) and
reads, once, the values of its run and of the window's reach on either side into registers:
forward sums each output's squares from them, backward computes each q_j once (one power and
one division per value read, not one per window member) and sums them. So every value of x
(and of scale and gy in backward) is read about once from memory, and neighbouring runs'
overlaps come from the cache. The reach (size // 2 before, (size - 1) // 2 after) is a template
argument, so the windows live in registers; a size's kernels are compiled at its first use
(GoogLeNet's and AlexNet's size 5 when this module is imported). s**-beta takes square roots
and a division for beta = 0.75, 0.5 and 1 (cpu.py's _negative_power), `pow` otherwise.

Layouts: a map is (N, C, inner) in memory with inner = H*W (NCHW) or 1 (NHWC, where a pixel's
channels are contiguous: kernels/mapformat.py). Thread t of a launch works on image or pixel
n = t / (runs * inner), run r = t / inner % runs, position t % inner, so neighbouring threads
touch neighbouring memory in both layouts: two divisions by launch constants (cuda_divide.py),
32-bit index math with 64-bit offsets, launches of fewer than 2**31 threads. Channels last,
when C is a multiple of RUN and the arrays are aligned, a run's own values move as one vector
load or store (16 bytes of bf16, two of float32).

Maps are float32, float64 or bfloat16; scale is in the type the maps compute in (float32
beside bf16 maps). One template serves every map type: values are widened exactly, computed in
acc_t<M> and each output is rounded once (cuda_pointwise's STORAGE_SOURCE), so a call on bf16
maps gives the bits of the float32 kernels on bf16_to_float of its maps followed by
float_to_bf16 of its outputs, with no float32 map in memory. No allocation, no host
synchronization; CuPy's current stream.
"""
from __future__ import annotations

import functools

import cupy as cp
import numpy as np

from .cpu import _lrn_reach
from .cuda_divide import DIVIDE_SOURCE, INDEX_LIMIT, divider
from .cuda_pointwise import STORAGE_SOURCE, VECTOR_SOURCE, map_ctype
from .mapformat import common_layout, in_memory_order

#: Channels a thread owns (a multiple of every vector width).
RUN = 8

_SOURCE = DIVIDE_SOURCE + VECTOR_SOURCE + STORAGE_SOURCE + r"""
#define RUN """ + str(RUN) + r"""

// s**-beta: square roots and a division for AlexNet's 0.75 (and 0.5, 1), as cpu.py computes it.
template<typename A>
__device__ __forceinline__ A negative_power(A s, A beta) {
    if (beta == (A)0.75) { const A r = sqrt(s); return (A)1 / (r * sqrt(r)); }
    if (beta == (A)0.5) return (A)1 / sqrt(s);
    if (beta == (A)1) return (A)1 / s;
    return pow(s, -beta);
}

// Where a thread works: channel c of its position lies at base + c * inner.
struct Run { long long base; int c0; };

__device__ __forceinline__ bool locate(Run& run, unsigned int C, unsigned int inner,
                                       unsigned int runs, unsigned int inner_mul,
                                       unsigned int inner_shift, unsigned int runs_mul,
                                       unsigned int runs_shift, unsigned int count) {
    const unsigned int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= count) return false;
    const unsigned int q = divide(t, inner_mul, inner_shift);      // n * runs + r
    const unsigned int n = divide(q, runs_mul, runs_shift);
    run.c0 = (int)((q - n * runs) * RUN);
    run.base = (long long)n * C * inner + (t - q * inner);
    return true;
}

// v[m] = a at channel c0 - LEAD + m, widened, for m < LEAD + RUN + TRAIL; 0 outside [0, C).
// `vectors` (channels last, C a multiple of RUN, aligned): the run's own values in one load.
template<typename M, int LEAD, int TRAIL>
__device__ __forceinline__ void window(const M* a, acc_t<M>* v, const Run& run, int C,
                                       unsigned int inner, bool vectors) {
    if (vectors) {
        const Pack<M, RUN> own = load<M, RUN>(a + run.base, run.c0 / RUN);
        #pragma unroll
        for (int j = 0; j < RUN; ++j) v[LEAD + j] = widen(own.v[j]);
        #pragma unroll
        for (int m = 0; m < LEAD; ++m) {
            const int c = run.c0 - LEAD + m;
            v[m] = c >= 0 ? widen(a[run.base + c]) : (acc_t<M>)0;
        }
        #pragma unroll
        for (int m = 0; m < TRAIL; ++m) {
            const int c = run.c0 + RUN + m;
            v[LEAD + RUN + m] = c < C ? widen(a[run.base + c]) : (acc_t<M>)0;
        }
        return;
    }
    #pragma unroll
    for (int m = 0; m < LEAD + RUN + TRAIL; ++m) {
        const int c = run.c0 - LEAD + m;
        v[m] = c >= 0 && c < C ? widen(a[run.base + (long long)c * inner]) : (acc_t<M>)0;
    }
}

// a at the run's channels (those below C) = v, each rounded once to M.
template<typename M>
__device__ __forceinline__ void put(M* a, const acc_t<M>* v, const Run& run, int C,
                                    unsigned int inner, bool vectors) {
    if (vectors) {
        Pack<M, RUN> own;
        #pragma unroll
        for (int j = 0; j < RUN; ++j) own.v[j] = narrow<M>(v[j]);
        store<M, RUN>(a + run.base, run.c0 / RUN, own);
        return;
    }
    #pragma unroll
    for (int j = 0; j < RUN; ++j)
        if (run.c0 + j < C) a[run.base + (long long)(run.c0 + j) * inner] = narrow<M>(v[j]);
}

#define LAUNCH unsigned int C, unsigned int inner, unsigned int runs, unsigned int inner_mul, \
               unsigned int inner_shift, unsigned int runs_mul, unsigned int runs_shift, \
               unsigned int count, int vectors

// Window of channel c: c - BEFORE .. c + AFTER. Sums in ascending channel order.
template<typename M, int BEFORE, int AFTER>
__global__ void lrn_forward(const M* __restrict__ x, M* __restrict__ y,
                            acc_t<M>* __restrict__ scale, double alpha_over_size, double k,
                            double beta, LAUNCH) {
    typedef acc_t<M> A;
    Run run;
    if (!locate(run, C, inner, runs, inner_mul, inner_shift, runs_mul, runs_shift, count))
        return;
    A v[BEFORE + RUN + AFTER];
    window<M, BEFORE, AFTER>(x, v, run, (int)C, inner, vectors);
    A s[RUN], out[RUN];
    #pragma unroll
    for (int j = 0; j < RUN; ++j) {
        A sum = 0;
        #pragma unroll
        for (int m = 0; m <= BEFORE + AFTER; ++m) sum += v[j + m] * v[j + m];
        s[j] = sum * (A)alpha_over_size + (A)k;
        out[j] = v[BEFORE + j] * negative_power(s[j], (A)beta);
    }
    put<A>(scale, s, run, (int)C, inner, vectors);
    put<M>(y, out, run, (int)C, inner, vectors);
}

// Channel c lies in the windows of channels c - AFTER .. c + BEFORE: q over the run's channels
// and that reach (0 outside the map), then each gx from its own values and its q's in
// ascending channel order.
template<typename M, int BEFORE, int AFTER>
__global__ void lrn_backward(const M* __restrict__ x, const acc_t<M>* __restrict__ scale,
                             const M* __restrict__ gy, M* __restrict__ gx, double coef,
                             double beta, LAUNCH) {
    typedef acc_t<M> A;
    const int SPAN = AFTER + RUN + BEFORE;
    Run run;
    if (!locate(run, C, inner, runs, inner_mul, inner_shift, runs_mul, runs_shift, count))
        return;
    A xv[SPAN], sv[SPAN], gv[SPAN], q[SPAN], p[RUN] = {};
    window<M, AFTER, BEFORE>(x, xv, run, (int)C, inner, vectors);
    window<A, AFTER, BEFORE>(scale, sv, run, (int)C, inner, vectors);
    window<M, AFTER, BEFORE>(gy, gv, run, (int)C, inner, vectors);
    #pragma unroll
    for (int m = 0; m < SPAN; ++m) {
        const int c = run.c0 - AFTER + m;
        q[m] = 0;
        if (c >= 0 && c < (int)C) {
            const A power = negative_power(sv[m], (A)beta);
            q[m] = gv[m] * xv[m] * power / sv[m];
            if (m >= AFTER && m < AFTER + RUN) p[m - AFTER] = power;
        }
    }
    A out[RUN];
    #pragma unroll
    for (int j = 0; j < RUN; ++j) {
        A acc = 0;
        #pragma unroll
        for (int m = 0; m <= AFTER + BEFORE; ++m) acc += q[j + m];
        out[j] = run.c0 + j < (int)C
            ? gv[AFTER + j] * p[j] - (A)coef * xv[AFTER + j] * acc : (A)0;
    }
    put<M>(gx, out, run, (int)C, inner, vectors);
}
"""

_CTYPES = ("float", "double", "bf16")
_THREADS = 256


@functools.lru_cache(maxsize=None)
def _module(before: int, after: int):
    """The kernels of one window reach, compiled at their first use."""
    return cp.RawModule(code=_SOURCE, options=("--std=c++14",), name_expressions=[
        f"{name}<{t}, {before}, {after}>" for name in ("lrn_forward", "lrn_backward")
        for t in _CTYPES])


_module(*_lrn_reach(5))              # AlexNet's and GoogLeNet's size


def _run(name: str, spec, arrays, args: tuple) -> None:
    """Kernel `name` over `arrays` in its order: maps (N, C, H, W) of one dtype and the scale
    (the second array), all of one dense layout, in launches of fewer than 2**31 threads.
    `args`: the kernel's arguments between its arrays and its launch geometry."""
    x, scale = arrays[0], arrays[1 if name == "lrn_backward" else 2]
    maps = [a for a in arrays if a is not scale]
    layout = common_layout(name, arrays)
    ctype = map_ctype(x.dtype)
    if ctype is None or any(m.dtype != x.dtype or m.shape != x.shape for m in maps):
        raise TypeError(f"{name}: takes float32, float64 or bfloat16 maps of one dtype and "
                        f"shape, got {[(str(m.dtype), m.shape) for m in maps]}")
    want = np.dtype(np.float32 if ctype == "bf16" else x.dtype)
    if scale.dtype != want or scale.shape != x.shape:
        raise TypeError(f"{name}: scale must be {want} {x.shape} beside {x.dtype} maps, got "
                        f"{scale.dtype} {scale.shape}")
    if not x.size:
        return
    n, c, h, w = x.shape
    inner = 1 if layout == "nhwc" else h * w
    runs = -(-c // RUN)
    flat = [in_memory_order(a) for a in arrays]
    vectors = inner == 1 and c % RUN == 0 and all(a.data.ptr % (RUN * a.itemsize) == 0
                                                  for a in flat)
    before, after = _lrn_reach(spec.size)
    kernel = _module(before, after).get_function(f"{name}<{ctype}, {before}, {after}>")
    per_image = c * inner                             # values of one image (or pixel)
    outer = x.size // per_image                       # images (NCHW) or pixels (NHWC)
    per_launch = max((INDEX_LIMIT - 1) // (runs * inner), 1)
    by_inner, by_runs = divider(inner), divider(runs)
    for o0 in range(0, outer, per_launch):
        o1 = min(o0 + per_launch, outer)
        count = (o1 - o0) * runs * inner
        kernel(((count + _THREADS - 1) // _THREADS,), (_THREADS,),
               tuple(a[o0 * per_image:o1 * per_image] for a in flat) + args
               + (np.uint32(c), np.uint32(inner), np.uint32(runs), *by_inner, *by_runs,
                  np.uint32(count), np.int32(vectors)))


def lrn_forward(x, y, scale, spec) -> None:
    """scale = k + alpha/size * window sum of x**2; y = x * scale**-beta. x, y, scale
    (N, C, H, W), all NCHW or all channels last; scale float32 beside bf16 maps."""
    _run("lrn_forward", spec, (x, y, scale),
         (np.float64(spec.alpha / spec.size), np.float64(spec.k), np.float64(spec.beta)))


def lrn_backward(x, y, scale, gy, gx, spec) -> None:
    """gx from x, scale and gy (y is not read and may be None); overwrites gx."""
    _run("lrn_backward", spec, (x, scale, gy, gx),
         (np.float64(2.0 * spec.alpha * spec.beta / spec.size), np.float64(spec.beta)))
