"""The SGD update (minidnn/optim.py) as one CuPy raw kernel launch per dtype for all parameters.

What is fused. The reference (kernels/cpu.py: sgd_update) takes up to six array operations
per parameter, each a kernel launch and a pass or two over the parameter's bytes:

    tmp = w * wd ; tmp = tmp + g          (when weight_decay != 0)
    v = v * momentum ; v = v + tmp        (when momentum != 0; tmp is g without weight decay)
    u = v * lr ; w = w - u                (u = g * lr without momentum)

Here one thread runs all of them for its values: it reads w, g and v once and writes w and v
once (5 passes over the parameter's bytes instead of up to 15), and one launch covers every
parameter of a dtype (ResNet-50's 161 parameters: one launch instead of about a thousand).

Why the bits are the same. Every operation is rounded on its own, in the parameter's dtype,
by the intrinsics __fmul_rn / __fadd_rn / __fsub_rn (float) and __dmul_rn / __dadd_rn /
__dsub_rn (double), which the compiler may not contract into fused multiply-adds; the
operands are those of the reference, in its order (addition and multiplication are
commutative in IEEE arithmetic, so `tmp + g` as the kernel writes it is `tmp += g`'s number).
The scalars are rounded to the dtype on the host (np.float32(lr)), as the reference rounds
them. Only NaN payloads may differ (the GPU makes canonical NaNs).

The learning rate in device memory. A schedule changes the rate every step, and a step
replayed from a CUDA graph (minidnn/step_graph.py) launches the kernels with the arguments
they were captured with. So the kernel does not take the rate as an argument: it reads it
from a one-element array of its dtype (a DeviceRate, kept in the caller's `cache`), which a
plain call writes on the current stream before its launches, and which the caller writes
before each replay when the update was captured (SGD.write_lr: nothing is written inside a
capture, where the write would be recorded with this step's rate). The write is ordered
before the launches that read it, and after those of the step before, by the stream alone.

The launch table. The parameters are cut into chunks of at most _CHUNK values; a device array
of rows (addresses in w, g and v of the chunk's first value, its number of values) lists
them, and block b updates chunk b. The table is built on the host and uploaded once, then
kept in the caller's `cache` until the tuple of addresses (with shapes, strides and dtypes,
and the stream) changes: a steady step costs one launch per dtype and no copy. A block moves
16-byte vectors when its chunk's three addresses are 16-byte aligned (a chunk starts a
multiple of _CHUNK values into its parameter, so it is aligned when the parameter is), then
the values past its last whole vector one at a time: any size works.

A parameter the kernel cannot take (a dtype other than float32 and float64, or w, g and v not
of one shape, dtype and dense layout) goes through the reference's operations on its CuPy
arrays: the same bits, with more launches. The kernel allocates nothing but the table, never
synchronizes with the host, and runs on CuPy's current stream.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from . import cpu as _cpu
from .cuda_pointwise import ROUNDED_SOURCE, VECTOR_SOURCE
from .mapformat import common_layout

_SOURCE = VECTOR_SOURCE + ROUNDED_SOURCE + r"""
// One chunk of one parameter: the addresses of its first value in w, g and v (v: 0 without
// momentum) and its number of values.
struct Chunk { unsigned long long w, g, v, n; };

// One value, the reference's operations in its order: tmp = w * wd + g (WD),
// v = v * momentum + tmp (MOM; v updated through the reference), then w - v * lr.
template<typename T, bool WD, bool MOM>
__device__ __forceinline__ T update(T w, T g, T& v, T lr, T momentum, T wd) {
    if (WD) g = add(mul(w, wd), g);
    if (MOM) { v = add(mul(v, momentum), g); g = v; }
    return sub(w, mul(g, lr));
}

// Block b updates chunk b: 16-byte vectors when its addresses allow, then the rest value by
// value (all of it when they do not).
template<typename T, bool WD, bool MOM>
__global__ void sgd_update(const Chunk* __restrict__ chunks, const T* __restrict__ rate,
                           T momentum, T wd) {
    const int VEC = 16 / sizeof(T);
    const T lr = *rate;          // written before the launch (DeviceRate.write)
    const Chunk c = chunks[blockIdx.x];
    T* w = reinterpret_cast<T*>(c.w);
    const T* g = reinterpret_cast<const T*>(c.g);
    T* v = reinterpret_cast<T*>(c.v);
    const unsigned int n = (unsigned int)c.n;
    unsigned int first_single = 0;
    if (((c.w | c.g | c.v) & 15ull) == 0) {
        const unsigned int vectors = n / VEC;
        for (unsigned int k = threadIdx.x; k < vectors; k += blockDim.x) {
            Pack<T, VEC> a = load<T, VEC>(w, k);
            const Pack<T, VEC> b = load<T, VEC>(g, k);
            Pack<T, VEC> m = {};
            if (MOM) m = load<T, VEC>(v, k);
            #pragma unroll
            for (int j = 0; j < VEC; ++j)
                a.v[j] = update<T, WD, MOM>(a.v[j], b.v[j], m.v[j], lr, momentum, wd);
            store<T, VEC>(w, k, a);
            if (MOM) store<T, VEC>(v, k, m);
        }
        first_single = vectors * VEC;
    }
    for (unsigned int i = first_single + threadIdx.x; i < n; i += blockDim.x) {
        T m = MOM ? v[i] : (T)0;
        w[i] = update<T, WD, MOM>(w[i], g[i], m, lr, momentum, wd);
        if (MOM) v[i] = m;
    }
}
"""

_CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


def _kernel_name(ctype: str, weight_decay: bool, momentum: bool) -> str:
    return f"sgd_update<{ctype}, {str(weight_decay).lower()}, {str(momentum).lower()}>"


_module = cp.RawModule(code=_SOURCE, name_expressions=[
    _kernel_name(ctype, wd, mom) for ctype in _CTYPES.values()
    for wd in (False, True) for mom in (False, True)])

_THREADS = 256
#: Values per chunk (one block each): 32 iterations of a thread over float vectors, enough
#: blocks for a large parameter to fill the GPU (VGG-16's 138M values: about 4,200), and far
#: below 2**31, so the kernel's indices are 32-bit.
_CHUNK = 2**15
_CACHE_KEY = "cuda_sgd"


class DeviceRate:
    """The learning rate where the kernel reads it: one float32 and one float64 value in
    device memory, each np.float32(lr) / np.float64(lr) as the reference rounds it.

    alone: True when the last update that used it read its rate from here alone (no
    parameter went through the reference's operations, which take the host's number): a
    graph captured of such an update replays with whatever rate was written before.
    """

    def __init__(self):
        self.arrays = {np.dtype(np.float32): cp.empty(1, np.float32),
                       np.dtype(np.float64): cp.empty(1, np.float64)}
        self.value: float | None = None   # the rate last written
        self.alone = False

    def write(self, lr: float) -> None:
        """Set the rate of the next launches, on the current stream (a fill per dtype, the
        value rounded on the host as the reference rounds it)."""
        lr = float(lr)
        for dtype, array in self.arrays.items():
            array.fill(dtype.type(lr))
        self.value = lr


def device_rate(cache) -> DeviceRate:
    """The DeviceRate kept in `cache` (kernels/cpu.SGD_RATE), made at the first call; a new
    one when there is no cache."""
    if cache is None:
        return DeviceRate()
    rate = cache.get(_cpu.SGD_RATE)
    if rate is None:
        rate = cache[_cpu.SGD_RATE] = DeviceRate()
    return rate


def _fusable(w, g, v) -> bool:
    """True when the kernel can update this triple: float32 or float64, one shape and dtype,
    one dense layout (NCHW or channels-last; kernels/mapformat.py), so that the three arrays'
    values lie in one memory order from their first addresses."""
    arrays = (w, g) if v is None else (w, g, v)
    dtype = np.dtype(w.dtype)
    if dtype not in _CTYPES or any(np.dtype(a.dtype) != dtype or a.shape != w.shape
                                   for a in arrays):
        return False
    try:
        common_layout("sgd_update", arrays)
    except ValueError:          # not dense, or NCHW mixed with NHWC
        return False
    return True


def _table(triples) -> np.ndarray:
    """(chunks, 4) uint64 rows (w, g, v addresses of a chunk's first value, its values) of
    dense triples of one dtype; v's address is 0 where v is None."""
    rows = []
    for w, g, v in triples:
        itemsize = w.dtype.itemsize
        pw, pg, pv = w.data.ptr, g.data.ptr, 0 if v is None else v.data.ptr
        for s in range(0, w.size, _CHUNK):
            offset = s * itemsize
            rows.append((pw + offset, pg + offset, pv + offset if pv else 0,
                         min(_CHUNK, w.size - s)))
    return np.array(rows, dtype=np.uint64).reshape(-1, 4)


class _Plan:
    """The launches of one list of parameters: per dtype (ctype, dtype, device table, chunks),
    and the indices of the parameters left to the reference's operations. key: what it was
    built for (see _key)."""

    def __init__(self, key, params):
        self.key = key
        groups: dict = {}
        self.rest = []
        for i, (w, g, v) in enumerate(params):
            if _fusable(w, g, v):
                if w.size:
                    groups.setdefault(np.dtype(w.dtype), []).append((w, g, v))
            else:
                self.rest.append(i)
        # Uploaded on the current stream, which the key names, so the launches that use the
        # table are ordered after its copy.
        self.launches = []
        for dtype, triples in groups.items():
            table = _table(triples)
            self.launches.append((_CTYPES[dtype], dtype, cp.asarray(table), table.shape[0]))


def _key(params) -> tuple:
    """The current stream and every array's address, shape, strides and dtype: a plan built
    for an equal key launches correctly on these arrays."""
    return (cp.cuda.get_current_stream().ptr,) + tuple(
        None if a is None else (a.data.ptr, a.shape, a.strides, a.dtype)
        for triple in params for a in triple)


def sgd_update(params, lr: float, momentum: float, weight_decay: float, cache=None) -> None:
    """One SGD step over CuPy parameters in place: kernels/cpu.py's sgd_update, bit for bit,
    in one launch per dtype.

    params: [(w, g, v)]: parameter, gradient and momentum buffer of one shape and dtype each
    (float32 or float64 for the kernel; any other dtype or layout goes through the reference);
    v is updated in place, and ignored (may be None) when momentum is 0.
    lr, momentum, weight_decay: Python floats (rounded to each parameter's dtype). The
    kernel reads lr from the cache's DeviceRate, which this call writes first on the current
    stream, except while the stream is captured into a CUDA graph: the caller then writes it
    before each replay (`cache[SGD_RATE].write(lr)`; optim.SGD.write_lr).
    cache: a dict the caller keeps between steps (the optimizer does); the launch table and
    the DeviceRate live there, the table rebuilt only when the arrays' addresses, shapes,
    strides or dtypes, or the current stream, change. None: built and uploaded for this call
    alone.
    """
    params = [(w, g, v if momentum else None) for w, g, v in params]
    if momentum and any(v is None for _, _, v in params):
        raise ValueError("sgd_update: momentum needs a buffer for every parameter; got None")
    key = _key(params)
    plan = None if cache is None else cache.get(_CACHE_KEY)
    if plan is None or plan.key != key:
        plan = _Plan(key, params)
        if cache is not None:
            cache[_CACHE_KEY] = plan
    rate = device_rate(cache)
    if not cp.cuda.get_current_stream().is_capturing():
        rate.write(lr)
    elif rate.value is None:
        raise ValueError("sgd_update: captured before its learning rate was ever written "
                         "(run one plain update with the same cache first)")
    rate.alone = not plan.rest
    for ctype, dtype, table, chunks in plan.launches:
        scalar = dtype.type
        kernel = _module.get_function(_kernel_name(ctype, bool(weight_decay), bool(momentum)))
        kernel((chunks,), (_THREADS,),
               (table, rate.arrays[dtype], scalar(momentum), scalar(weight_decay)))
    if plan.rest:
        _cpu.sgd_update([params[i] for i in plan.rest], lr, momentum, weight_decay)
