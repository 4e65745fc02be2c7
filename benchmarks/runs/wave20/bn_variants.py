"""Where the batch-norm passes of a bf16 step lose time: variants of kernels/cuda_batchnorm.py's
source, each timed on ResNet-50's shapes (b256, channels last) from CUDA graphs of back-to-back
calls (no host time), and each variant's output bits compared with the source as it is.

    python3 benchmarks/runs/wave20/bn_variants.py [--repeats 20] [--shapes 12]

Variants (the source's text changed in one place each):
    base    the source as it is
    cvt     float32 -> bf16 rounding by the hardware's conversion (cvt.rn.bf16.f32; a NaN
            kept as the portable path keeps it) instead of integer operations
    thresh  the ReLU's mask on a bf16 output as one comparison (v > the largest float32
            that rounds to a bf16 zero) instead of rounding v and widening it back
    both    cvt and thresh
    run8    NHWC sums: runs of 8 rows instead of 4 (more loads in flight; other bits)
and two passes beside the source's per-value gradient passes: 'grad rows' and 'grad+relu
rows', in which a thread takes 4 vectors of the same channels (rows T apart), so that it loads
the per-channel coefficients once for 4 vectors instead of once for each. (Call 2 ran it at
b37efc1 with its own copies of the timer and the cached `empty`, since moved to
scripts/benchlib.py.)
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

ROWS = 4

ROWS_SOURCE = r"""
// A thread takes vectors k, k + T, ..., k + (R - 1) T of channels-last maps (T threads, a
// multiple of the C / VEC vectors of a pixel, so that all R have the channels of vector k):
// the per-channel coefficients loaded once for R vectors.
template<typename M, int VEC, int MODE, int R>
__device__ __forceinline__ void grad_rows(const M* x, const M* gy, M* gx, const acc_t<M>* coef,
                                          unsigned int C, unsigned int n) {
    typedef acc_t<M> T;
    const unsigned int k = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned int total = gridDim.x * blockDim.x, vectors = n / VEC, per_pixel = C / VEC;
    const unsigned int v = k % per_pixel;
    Pack<T, VEC> m, a, b, d, s, t;
    m = load<T, VEC>(coef, v);
    a = load<T, VEC>(coef + C, v);
    b = load<T, VEC>(coef + 2 * C, v);
    d = load<T, VEC>(coef + 3 * C, v);
    if (MODE) { s = load<T, VEC>(coef + 4 * C, v); t = load<T, VEC>(coef + 5 * C, v); }
    Pack<M, VEC> xv[R], g[R];
    #pragma unroll
    for (int r = 0; r < R; ++r) {
        const unsigned int i = k + r * total;
        if (i < vectors) { xv[r] = load<M, VEC>(x, i); g[r] = load<M, VEC>(gy, i); }
    }
    #pragma unroll
    for (int r = 0; r < R; ++r) {
        const unsigned int i = k + r * total;
        if (i >= vectors) break;
        #pragma unroll
        for (int j = 0; j < VEC; ++j)
            g[r].v[j] = grad_value<M, MODE>(xv[r].v[j], g[r].v[j], m.v[j], a.v[j], b.v[j],
                                            d.v[j], MODE ? s.v[j] : (T)0, MODE ? t.v[j] : (T)0);
        store<M, VEC>(gx, i, g[r]);
    }
}
template<typename M, int VEC, int MODE, int R>
__global__ void bn_grad_rows(const M* x, const M* gy, M* gx, const acc_t<M>* coef,
                             unsigned int C, unsigned int n) {
    grad_rows<M, VEC, MODE, R>(x, gy, gx, coef, C, n);
}
"""

CVT = r"""
__device__ __forceinline__ unsigned short bf16_bits(float x) {
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
    return x != x ? (unsigned short)((__float_as_uint(x) >> 16) | 0x40u) : r;
}
"""

THRESH = r"""
template<typename M>
__device__ __forceinline__ bool relu_passes(acc_t<M> v) { return v > (acc_t<M>)0; }
template<>
__device__ __forceinline__ bool relu_passes<bf16>(float v) { return v > __uint_as_float(0x8000u); }
"""


def replace(src: str, pattern: str, new: str) -> str:
    out, n = re.subn(pattern, lambda _: new, src, count=1, flags=re.S)
    if n != 1:
        raise SystemExit(f"pattern not found: {pattern[:60]}")
    return out


def cvt(src):
    return replace(src, r"__device__ __forceinline__ unsigned short bf16_bits\(float x\) \{.*?\n\}\n",
                   CVT.lstrip("\n"))


def thresh(src):
    return replace(src, r"template<typename M>\n__device__ __forceinline__ bool relu_passes"
                        r"\(acc_t<M> v\) \{.*?\n\}\n", THRESH.lstrip("\n"))


VARIANTS = {
    "base": lambda s: s,
    "cvt": cvt,
    "thresh": thresh,
    "both": lambda s: thresh(cvt(s)),
    "run8": lambda s: replace(s, r"constexpr int RUN = 4;", "constexpr int RUN = 8;"),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    import numpy as np
    import cupy as cp
    from minidnn import models
    from minidnn.kernels import mapformat
    from minidnn.kernels import cuda_batchnorm as bn
    from bn_bandwidth import passes
    from benchlib import CachedEmpty, graph_seconds
    bn.cp = CachedEmpty(cp)
    names = [n for n in bn._instances() if "bf16" in n or n == "bn_finish_backward<float>"]
    rows_names = [f"bn_grad_rows<bf16, 8, {m}, {ROWS}>" for m in (0, 1)]
    net = models.build("resnet50")
    shapes = Counter(tuple(n.layer.in_shapes[0][1:]) for n in net.nodes
                     if n.layer.kind == "batchnorm")
    batch = 256
    rng = np.random.default_rng(0)
    bf16 = mapformat.MapFormat("nhwc", "bf16").map_dtype(np.float32)

    flats = {}

    def device_map(shape, values=None):
        host = (rng.standard_normal(shape).astype(np.float32) if values is None else values)
        flat = cp.asarray(mapformat.arrange(host.astype(bf16), "nhwc").reshape(-1).view(np.uint8))
        view = mapformat.shaped(flat, shape, bf16, "nhwc")
        flats[id(view)] = flat
        return view

    maps = {}
    for (c, h, w) in shapes:
        shape = (batch, c, h, w)
        maps[(c, h, w)] = dict(
            x=device_map(shape), gy=device_map(shape), gx=device_map(shape), y=device_map(shape),
            w=cp.asarray(1 + 0.1 * rng.standard_normal(c), dtype=np.float32),
            b=cp.asarray(0.1 * rng.standard_normal(c), dtype=np.float32),
            mean=cp.asarray(0.1 * rng.standard_normal(c), dtype=np.float32),
            invstd=cp.asarray(1 + 0.1 * rng.random(c), dtype=np.float32))
    # Values over the whole exponent range (ties, subnormals, infinities, NaN) for the bit check.
    special_shape = (64, 64, 8, 8)
    e = rng.uniform(-140, 125, special_shape)
    sv = (np.sign(rng.standard_normal(special_shape)) * np.exp2(e)).astype(np.float32)
    sv.reshape(-1)[:4] = [np.inf, -np.inf, np.nan, 0.0]
    special = dict(x=device_map(special_shape, sv), gy=device_map(special_shape),
                   gx=device_map(special_shape), y=device_map(special_shape),
                   w=cp.asarray(rng.uniform(0.5, 2, 64), dtype=np.float32),
                   b=cp.asarray(rng.uniform(-1e-38, 1e-38, 64), dtype=np.float32),
                   mean=cp.zeros(64, np.float32), invstd=cp.ones(64, np.float32))

    def table_of(m):
        t = passes(cp, bn, m["x"], m["gy"], m["gx"], m["y"], m["w"], m["b"], m["mean"],
                   m["invstd"])
        geometry = bn._geometry(m["x"], m["gy"], m["gx"])
        c = m["x"].shape[1]
        coef = cp.zeros((6, c), np.float32)
        coef[4:] = bn._forward_coefficients(m["mean"], m["invstd"], m["w"], m["b"])
        coef[:4] = cp.asarray(rng.standard_normal((4, c)), dtype=np.float32) \
            if "coef" not in m else m["coef"]
        m["coef"] = coef[:4].copy()
        n = m["x"].size
        vectors, per_pixel = n // 8, c // 8
        # Blocks of a multiple of C / VEC threads, so that every thread's R vectors share
        # their channels (C <= 2048: C / VEC <= 256).
        block = (256 // per_pixel) * per_pixel
        grid = -(-(-(-vectors // ROWS)) // block)

        def rows(mode):
            def run():
                bn._module.get_function(f"bn_grad_rows<bf16, 8, {mode}, {ROWS}>")(
                    (grid,), (block,), (m["x"], m["gy"], m["gx"], coef, np.uint32(c),
                                        np.uint32(n)))
            return run
        t["grad"] = (lambda: bn._per_value("bn_grad_last", ("bn_grad_planes", "0"), geometry,
                                           (m["x"], m["gy"], m["gx"]), coef), 3)
        t["grad+relu"] = (lambda: bn._per_value("bn_grad_relu_last", ("bn_grad_planes", "1"),
                                                geometry, (m["x"], m["gy"], m["gx"]), coef), 3)
        t["grad rows"] = (rows(0), 3)
        t["grad+relu rows"] = (rows(1), 3)
        return t, geometry

    def outputs(m):
        """The bits each pass writes (y, gx, the partial sums) for the bit check."""
        t, geometry = table_of(m)
        out = {}
        for name, (run, _) in t.items():
            flats[id(m["gx"])].fill(0)
            flats[id(m["y"])].fill(0)
            if "sums" in name or name == "stats":
                mode = {"stats": 0, "grad sums": 1, "grad sums+relu": 2}[name]
                partial, _ = bn._channel_partials(
                    mode, geometry, m["x"], None if mode == 0 else m["gy"],
                    None if mode == 0 else (m["mean"], m["invstd"], m["w"], m["b"]))
                out[name] = cp.asnumpy(partial).copy()
            else:
                run()
                target = m["y"] if name.startswith("affine") else m["gx"]
                out[name] = cp.asnumpy(flats[id(target)])
        return out

    reference = None
    results = {}
    for variant in args.variants.split(","):
        src = VARIANTS[variant](bn._SOURCE) + ROWS_SOURCE
        bn._module = cp.RawModule(code=src, options=("--std=c++14",),
                                  name_expressions=names + rows_names)
        bits = {}
        for key, m in (("special", special), ("shape", maps[(256, 56, 56)])):
            bits[key] = outputs(m)
        if reference is None:
            reference = bits
            same = "reference"
        else:
            differ = [f"{k}:{p}" for k in bits for p in bits[k]
                      if not np.array_equal(bits[k][p].view(np.uint8),
                                            reference[k][p].view(np.uint8))]
            same = "same bits" if not differ else "differ: " + ", ".join(differ)
        rows_same = all(np.array_equal(bits[k]["grad rows"], bits[k]["grad"])
                        and np.array_equal(bits[k]["grad+relu rows"], bits[k]["grad+relu"])
                        for k in bits)
        print(f"== {variant}: {same}; rows passes = per-value passes: {rows_same}", flush=True)
        totals, nbytes = Counter(), Counter()
        for (c, h, w), count in sorted(shapes.items(), key=lambda kv: -kv[0][1]):
            m = maps[(c, h, w)]
            t, _ = table_of(m)
            row = f"  {str((c, h, w)) + ' x ' + str(count):<22}"
            for name, (run, k) in t.items():
                s = graph_seconds(cp, run, args.repeats)
                b = k * m["x"].nbytes
                totals[name] += s * count
                nbytes[name] += b * count
                row += f" {name}={b / s / 1e9:.0f}"
            print(row, flush=True)
        line = "  network ms:"
        for name in totals:
            line += f" {name}={totals[name] * 1e3:.3f} ({nbytes[name] / totals[name] / 1e9:.0f} GB/s)"
        print(line, flush=True)
        results[variant] = totals
    names_ = list(next(iter(results.values())))
    print("\n| variant | " + " | ".join(names_) + " |")
    print("| --- |" + " ---: |" * len(names_))
    for variant, totals in results.items():
        print(f"| {variant} | " + " | ".join(f"{totals[n] * 1e3:.3f}" for n in names_) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
