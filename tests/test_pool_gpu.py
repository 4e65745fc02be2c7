"""GPU pooling kernels (kernels/cuda_pool.py) bit for bit against the CuPy ElementwiseKernels
they replaced, and against cpu.py. Skipped without a CUDA GPU.

The replaced kernels are kept below, verbatim, as the reference: same semantics (first maximum
wins ties, padding never wins, PyTorch's avg-pool divisors) and the same summation order in
backward (oh ascending, then ow ascending), so every output must have identical bits, NaN,
infinities and signed zeros included. Against cpu.py, max-pool forward and argmax must be equal
and everything else close (cpu.py sums overlapping windows in another order). On bf16 maps, each
kernel against its contract: the float32 kernel on the widened maps, each output rounded once.
"""
import numpy as np
import pytest

from minidnn.kernels import PoolSpec, out_size

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")
cuda_pool = pytest.importorskip("minidnn.kernels.cuda_pool")
from minidnn.kernels import cpu  # noqa: E402
from test_pointwise_gpu import BF16, bf16_contract, bf16_maps, to_device  # noqa: E402


# ---- the replaced kernels (64-bit flat index, one thread per element) ------------------------
_GEOMETRY = ("int32 H, int32 W, int32 OH, int32 OW, int32 KH, int32 KW, int32 SH, int32 SW, "
             "int32 PH, int32 PW")

_legacy_maxpool_forward = cp.ElementwiseKernel(
    "raw T x, " + _GEOMETRY + ", float64 neg_inf",
    "T y, uint8 argmax",
    r"""
    const int ow = (int)(i % OW);
    const int oh = (int)((i / OW) % OH);
    const long long base = (i / ((long long)OW * OH)) * H * W;   // plane n * C + c
    const int h0 = oh * SH - PH, w0 = ow * SW - PW;
    T best = (h0 >= 0 && h0 < H && w0 >= 0 && w0 < W) ? x[base + (long long)h0 * W + w0]
                                                      : (T)neg_inf;
    int arg = 0;
    for (int kh = 0; kh < KH; ++kh) {
        const int h = h0 + kh;
        if (h < 0 || h >= H) continue;
        for (int kw = 0; kw < KW; ++kw) {
            const int w = w0 + kw;
            if ((kh == 0 && kw == 0) || w < 0 || w >= W) continue;
            const T v = x[base + (long long)h * W + w];
            if (v > best) { best = v; arg = kh * KW + kw; }
        }
    }
    y = best;
    argmax = (unsigned char)arg;
    """,
    "minidnn_test_legacy_maxpool2d_forward")

_COVERING = r"""
    const int a_h = h + PH - KH + 1, a_w = w + PW - KW + 1;
    const int oh_lo = a_h > 0 ? (a_h + SH - 1) / SH : 0;
    const int ow_lo = a_w > 0 ? (a_w + SW - 1) / SW : 0;
    const int oh_hi = min((h + PH) / SH, OH - 1);
    const int ow_hi = min((w + PW) / SW, OW - 1);
"""

_legacy_maxpool_backward = cp.ElementwiseKernel(
    "raw T gy, raw uint8 argmax, " + _GEOMETRY,
    "T gx",
    r"""
    const int w = (int)(i % W);
    const int h = (int)((i / W) % H);
    const long long obase = (i / ((long long)W * H)) * OH * OW;
    """ + _COVERING + r"""
    T acc = 0;
    for (int oh = oh_lo; oh <= oh_hi; ++oh) {
        const int kh = h - (oh * SH - PH);
        for (int ow = ow_lo; ow <= ow_hi; ++ow) {
            const long long o = obase + (long long)oh * OW + ow;
            if (argmax[o] == kh * KW + (w - (ow * SW - PW))) acc += gy[o];
        }
    }
    gx = acc;
    """,
    "minidnn_test_legacy_maxpool2d_backward")

_AVG_WINDOW = r"""
    const int hs0 = oh * SH - PH, ws0 = ow * SW - PW;
    const int he0 = min(hs0 + KH, H + PH), we0 = min(ws0 + KW, W + PW);
    const int hs = max(hs0, 0), ws = max(ws0, 0), he = min(he0, H), we = min(we0, W);
    const int count = count_include_pad ? (he0 - hs0) * (we0 - ws0) : (he - hs) * (we - ws);
"""

_legacy_avgpool_forward = cp.ElementwiseKernel(
    "raw T x, " + _GEOMETRY + ", bool count_include_pad",
    "T y",
    r"""
    const int ow = (int)(i % OW);
    const int oh = (int)((i / OW) % OH);
    const long long base = (i / ((long long)OW * OH)) * H * W;
    """ + _AVG_WINDOW + r"""
    T acc = 0;
    for (int h = hs; h < he; ++h)
        for (int w = ws; w < we; ++w) acc += x[base + (long long)h * W + w];
    y = count > 0 ? acc / (T)count : (T)0;
    """,
    "minidnn_test_legacy_avgpool2d_forward")

_legacy_avgpool_backward = cp.ElementwiseKernel(
    "raw T gy, " + _GEOMETRY + ", bool count_include_pad",
    "T gx",
    r"""
    const int w = (int)(i % W);
    const int h = (int)((i / W) % H);
    const long long obase = (i / ((long long)W * H)) * OH * OW;
    """ + _COVERING + r"""
    T acc = 0;
    for (int oh = oh_lo; oh <= oh_hi; ++oh) {
        for (int ow = ow_lo; ow <= ow_hi; ++ow) {
            """ + _AVG_WINDOW + r"""
            if (count > 0) acc += gy[obase + (long long)oh * OW + ow] / (T)count;
        }
    }
    gx = acc;
    """,
    "minidnn_test_legacy_avgpool2d_backward")


def _legacy_geometry(x_shape, y_shape, spec):
    (h, w), (oh, ow) = x_shape[2:], y_shape[2:]
    (kh, kw), (sh, sw), (ph, pw) = spec.kernel, spec.stride, spec.padding
    return h, w, oh, ow, kh, kw, sh, sw, ph, pw


# ---- helpers ------------------------------------------------------------------------------------
def out_shape(x_shape, spec):
    n, c, h, w = x_shape
    return (n, c, out_size(h, spec.kernel[0], spec.stride[0], spec.padding[0], 1, spec.ceil_mode),
            out_size(w, spec.kernel[1], spec.stride[1], spec.padding[1], 1, spec.ceil_mode))


def same_bits(a, b) -> bool:
    """Equal bit patterns (so NaN == NaN and 0.0 != -0.0), on the device."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    view = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return bool(cp.array_equal(a.view(view), b.view(view)))


def make_data(rng, shape, dtype, kind):
    """'ties': small integers, so windows often hold several equal maxima; 'normal';
    'special': infinities, NaN and signed zeros."""
    if kind == "ties":
        return rng.integers(-3, 4, shape).astype(dtype)
    if kind == "special":
        values = np.array([-np.inf, np.inf, np.nan, 0.0, -0.0, 1.0, -1.0], dtype)
        return rng.choice(values, shape)
    return rng.standard_normal(shape).astype(dtype)


def run_both(x, gy, spec):
    """Every output of the new kernels and of the replaced ones, as device arrays:
    {name: (new, old)} for max y, argmax, max gx, avg y, avg gx."""
    dtype = x.dtype
    y_shape = gy.shape
    out = {}
    y, arg = cp.full(y_shape, np.nan, dtype), cp.full(y_shape, 77, np.uint8)
    cuda_pool.maxpool2d_forward(x, y, arg, spec)
    ly, larg = cp.empty(y_shape, dtype), cp.empty(y_shape, np.uint8)
    geometry = _legacy_geometry(x.shape, y_shape, spec)
    _legacy_maxpool_forward(x, *geometry, -np.inf, ly, larg)
    out["max y"], out["argmax"] = (y, ly), (arg, larg)

    gx, lgx = cp.full(x.shape, np.nan, dtype), cp.empty(x.shape, dtype)
    cuda_pool.maxpool2d_backward(gy, arg, gx, spec)
    _legacy_maxpool_backward(gy, arg, *geometry, lgx)
    out["max gx"] = (gx, lgx)

    ya, lya = cp.full(y_shape, np.nan, dtype), cp.empty(y_shape, dtype)
    cuda_pool.avgpool2d_forward(x, ya, spec)
    _legacy_avgpool_forward(x, *geometry, bool(spec.count_include_pad), lya)
    out["avg y"] = (ya, lya)

    gxa, lgxa = cp.full(x.shape, np.nan, dtype), cp.empty(x.shape, dtype)
    cuda_pool.avgpool2d_backward(gy, gxa, spec)
    _legacy_avgpool_backward(gy, *geometry, bool(spec.count_include_pad), lgxa)
    out["avg gx"] = (gxa, lgxa)
    return out


def assert_same_as_legacy(x, gy, spec):
    out = run_both(x, gy, spec)
    bad = [name for name, (new, old) in out.items() if not same_bits(new, old)]
    assert not bad, f"{spec} {x.shape} {x.dtype}: bits differ in {bad}"
    return out


def assert_close_to_cpu(x, gy, spec, out):
    xh, gyh = cp.asnumpy(x), cp.asnumpy(gy)
    y, arg = np.empty(gyh.shape, xh.dtype), np.empty(gyh.shape, np.uint8)
    cpu.maxpool2d_forward(xh, y, arg, spec)
    np.testing.assert_array_equal(cp.asnumpy(out["max y"][0]), y)
    np.testing.assert_array_equal(cp.asnumpy(out["argmax"][0]), arg)
    gx = np.empty_like(xh)
    cpu.maxpool2d_backward(gyh, arg, gx, spec)
    tol = 1e-5 if xh.dtype == np.float32 else 1e-12
    np.testing.assert_allclose(cp.asnumpy(out["max gx"][0]), gx, rtol=tol, atol=tol)
    ya, gxa = np.empty_like(y), np.empty_like(xh)
    cpu.avgpool2d_forward(xh, ya, spec)
    cpu.avgpool2d_backward(gyh, gxa, spec)
    np.testing.assert_allclose(cp.asnumpy(out["avg y"][0]), ya, rtol=tol, atol=tol)
    np.testing.assert_allclose(cp.asnumpy(out["avg gx"][0]), gxa, rtol=tol, atol=tol)


SPECS = [
    PoolSpec(kernel=(2, 2), stride=(2, 2)),                                    # VGG, no overlap
    PoolSpec(kernel=(3, 3), stride=(2, 2)),                                    # AlexNet overlap
    PoolSpec(kernel=(3, 3), stride=(2, 2), padding=(1, 1), ceil_mode=True),
    PoolSpec(kernel=(3, 3), stride=(2, 2), padding=(1, 1), ceil_mode=True,
             count_include_pad=False),
    PoolSpec(kernel=(2, 2), stride=(2, 2), ceil_mode=True),
    PoolSpec(kernel=(3, 3), stride=(1, 1), padding=(1, 1)),                    # stride 1
    PoolSpec(kernel=(3, 2), stride=(1, 2), padding=(1, 0), count_include_pad=False),
    PoolSpec(kernel=(2, 2), stride=(3, 3)),                                    # gaps
    PoolSpec(kernel=(5, 3), stride=(3, 2), padding=(2, 1), ceil_mode=True,
             count_include_pad=False),
    PoolSpec(kernel=(1, 1), stride=(2, 2)),
    PoolSpec(kernel=(7, 7), stride=(1, 1), padding=(3, 3)),
]
SHAPES = [(2, 3, 9, 8), (1, 2, 17, 13), (3, 1, 7, 31), (2, 2, 2, 3)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_bits_match_the_replaced_kernels(spec, dtype):
    rng = np.random.default_rng(11)
    for shape in SHAPES:
        y_shape = out_shape(shape, spec)
        if min(y_shape[2:]) < 1:
            continue
        for kind in ("ties", "normal", "special"):
            x = cp.asarray(make_data(rng, shape, dtype, kind))
            gy = cp.asarray(make_data(rng, y_shape, dtype, "special" if kind == "special"
                                      else "normal"))
            out = assert_same_as_legacy(x, gy, spec)
            if kind != "special":
                assert_close_to_cpu(x, gy, spec, out)


@pytest.mark.parametrize("spec", [SPECS[0], SPECS[2], SPECS[5]], ids=str)
def test_large_plane(spec):
    """One plane of ~3 million values: in-plane offsets far past 16 bits, thousands of blocks
    per plane, odd sizes."""
    rng = np.random.default_rng(12)
    shape = (1, 2, 1531, 2053)
    x = cp.asarray(make_data(rng, shape, np.float32, "ties"))
    gy = cp.asarray(make_data(rng, out_shape(shape, spec), np.float32, "normal"))
    out = assert_same_as_legacy(x, gy, spec)
    assert_close_to_cpu(x, gy, spec, out)


def test_more_planes_than_a_grid_dimension_holds():
    spec = PoolSpec(kernel=(3, 3), stride=(2, 2), padding=(1, 1), ceil_mode=True)
    rng = np.random.default_rng(13)
    shape = (3, 30000, 5, 4)                      # 90000 planes > 65535
    x = cp.asarray(make_data(rng, shape, np.float64, "ties"))
    gy = cp.asarray(make_data(rng, out_shape(shape, spec), np.float64, "normal"))
    assert_same_as_legacy(x, gy, spec)


@pytest.mark.parametrize("limit", [1, 100, 1000])
@pytest.mark.parametrize("spec", [SPECS[0], SPECS[1], SPECS[5], SPECS[8]], ids=str)
def test_work_split_over_several_launches(spec, limit, monkeypatch):
    """With fewer threads allowed per launch, planes go in several launches (the path tensors
    of 2**31 or more threads' worth of work take) and nothing changes."""
    monkeypatch.setattr(cuda_pool, "_MAX_THREADS", limit)
    rng = np.random.default_rng(14)
    shape = (3, 7, 13, 11)
    x = cp.asarray(make_data(rng, shape, np.float32, "ties"))
    gy = cp.asarray(make_data(rng, out_shape(shape, spec), np.float32, "normal"))
    assert_same_as_legacy(x, gy, spec)


# Small integers from a hash of the flat index, written in place (no temporaries).
_fill_ties = cp.ElementwiseKernel(
    "", "T out",
    "out = (T)((int)((((unsigned long long)i * 2654435761ull) >> 13) % 7ull) - 3);",
    "minidnn_test_pool_fill_ties")


@pytest.mark.slow
def test_more_than_2_to_the_31_values():
    """2.15e9 inputs and, with stride 1, as many outputs and backward threads: several launches
    and plane offsets past 2**31. Planes are independent, so the first and last batch entries
    must match the same kernels run on those entries alone, and the replaced kernels."""
    spec = PoolSpec(kernel=(3, 3), stride=(1, 1), padding=(1, 1))
    shape = (64, 64, 725, 725)                     # 2_152_960_000 values
    n_values = int(np.prod(shape))
    assert n_values > 2**31
    need = n_values * (4 + 4 + 1 + 4) + 2**30          # x (also gy), y, argmax, gx, slack
    if cp.cuda.Device().mem_info[0] < need:
        pytest.skip(f"needs {need / 2**30:.0f} GiB of free GPU memory")
    try:
        x = cp.empty(shape, np.float32)
        _fill_ties(x)
        y, arg = cp.empty(shape, np.float32), cp.empty(shape, np.uint8)
        gx = cp.empty(shape, np.float32)
        cuda_pool.maxpool2d_forward(x, y, arg, spec)
        cuda_pool.maxpool2d_backward(x, arg, gx, spec)             # x doubles as gy
        for b in (0, shape[0] - 1):
            xb = x[b:b + 1].copy()
            out = assert_same_as_legacy(xb, xb, spec)
            assert same_bits(y[b:b + 1], out["max y"][0])
            assert same_bits(arg[b:b + 1], out["argmax"][0])
            assert same_bits(gx[b:b + 1], out["max gx"][0])
        ya = y                                                       # reuse the memory
        cuda_pool.avgpool2d_forward(x, ya, spec)
        cuda_pool.avgpool2d_backward(x, gx, spec)
        for b in (0, shape[0] - 1):
            xb = x[b:b + 1].copy()
            out = run_both(xb, xb, spec)
            assert same_bits(ya[b:b + 1], out["avg y"][0])
            assert same_bits(gx[b:b + 1], out["avg gx"][0])
    finally:
        x = y = arg = gx = ya = None
        cp.get_default_memory_pool().free_all_blocks()


# A kernel that spins for `cycles` before writing: work queued behind it on the same stream
# sees its result only if it really runs on that stream.
_slow_fill = cp.ElementwiseKernel(
    "T v, int64 cycles", "T out",
    "long long t0 = clock64(); while (clock64() - t0 < cycles) {} out = v;",
    "minidnn_test_pool_slow_fill")


def test_kernels_run_on_the_current_stream():
    spec = SPECS[2]
    rng = np.random.default_rng(16)
    shape = (4, 8, 33, 35)
    src = cp.asarray(make_data(rng, shape, np.float32, "normal"))
    gy_src = cp.asarray(make_data(rng, out_shape(shape, spec), np.float32, "normal"))
    want = run_both(src, gy_src, spec)
    cp.cuda.Device().synchronize()
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        x, gy = cp.zeros_like(src), cp.zeros_like(gy_src)
        _slow_fill(src, 20_000_000, x)                            # ~10 ms on s
        _slow_fill(gy_src, 1, gy)
        y, arg = cp.empty(gy.shape, np.float32), cp.empty(gy.shape, np.uint8)
        gx, ya, gxa = cp.empty_like(x), cp.empty_like(y), cp.empty_like(x)
        cuda_pool.maxpool2d_forward(x, y, arg, spec)
        cuda_pool.maxpool2d_backward(gy, arg, gx, spec)
        cuda_pool.avgpool2d_forward(x, ya, spec)
        cuda_pool.avgpool2d_backward(gy, gxa, spec)
    s.synchronize()
    for got, name in ((y, "max y"), (arg, "argmax"), (gx, "max gx"), (ya, "avg y"),
                      (gxa, "avg gx")):
        assert same_bits(got, want[name][0]), name



def test_rejects_what_the_kernels_would_misread():
    spec = SPECS[0]
    x = cp.zeros((1, 1, 4, 4), np.float32)
    y, arg = cp.zeros((1, 1, 2, 2), np.float32), cp.zeros((1, 1, 2, 2), np.uint8)
    with pytest.raises(TypeError):
        cuda_pool.maxpool2d_forward(x.astype(np.float16), y.astype(np.float16), arg, spec)
    with pytest.raises(TypeError):
        cuda_pool.maxpool2d_forward(x, y, arg.astype(np.int32), spec)
    with pytest.raises(ValueError):
        cuda_pool.avgpool2d_forward(cp.zeros((1, 1, 4, 8), np.float32)[..., ::2], y, spec)
    with pytest.raises(TypeError):
        cuda_pool.avgpool2d_forward(cp.zeros(x.shape, np.uint16).view(BF16), y, spec)  # mixed


def _channels_last(a):
    """a's values in a channels-last array of the same logical shape."""
    return cp.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_channels_last_kernels_give_the_bits_of_the_nchw_ones(spec, dtype):
    """Every channels-last kernel (the one-thread-per-window max-pool backward where windows
    tile the input, the gathering one elsewhere) against the NCHW kernels, signed zeros, NaN
    and infinities included."""
    rng = np.random.default_rng(15)
    for shape in SHAPES + [(3, 64, 8, 12), (2, 5, 6, 6)]:
        y_shape = out_shape(shape, spec)
        if min(y_shape[2:]) < 1:
            continue
        for kind in ("ties", "special"):
            x = cp.asarray(make_data(rng, shape, dtype, kind))
            gy = cp.asarray(make_data(rng, y_shape, dtype, "special"))
            want = run_both(x, gy, spec)
            y, arg = _channels_last(cp.empty(y_shape, dtype)), _channels_last(
                cp.empty(y_shape, np.uint8))
            cuda_pool.maxpool2d_forward(_channels_last(x), y, arg, spec)
            gx = _channels_last(cp.full(shape, np.nan, dtype))
            cuda_pool.maxpool2d_backward(_channels_last(gy), arg, gx, spec)
            ya, gxa = _channels_last(cp.empty(y_shape, dtype)), _channels_last(
                cp.full(shape, np.nan, dtype))
            cuda_pool.avgpool2d_forward(_channels_last(x), ya, spec)
            cuda_pool.avgpool2d_backward(_channels_last(gy), gxa, spec)
            got = {"max y": y, "argmax": arg, "max gx": gx, "avg y": ya, "avg gx": gxa}
            bad = [k for k, v in got.items() if not same_bits(cp.ascontiguousarray(v),
                                                              want[k][0])]
            assert not bad, f"{spec} {shape} {dtype} {kind}: NHWC bits differ in {bad}"


@pytest.mark.parametrize("spec", SPECS, ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_bf16_pooling_keeps_the_contract(spec, layout):
    """Max and average pooling, forward and backward, on bf16 maps against the float32 kernels
    on the widened maps with each output rounded once, bit for bit, argmax included: ties,
    NaN, infinities and signed zeros, sums and means that fall halfway between bf16 values."""
    rng = np.random.default_rng(17)
    for shape in SHAPES + [(3, 64, 8, 12)]:
        y_shape = out_shape(shape, spec)
        if min(y_shape[2:]) < 1:
            continue
        for kind in ("ties", "special", "halfway"):
            if kind == "halfway":
                x, gy = bf16_maps(shape, 18), bf16_maps(y_shape, 19)
            else:
                x = make_data(rng, shape, np.float32, kind).astype(BF16)
                gy = make_data(rng, y_shape, np.float32, "special").astype(BF16)
            x, gy = to_device(x, layout), to_device(gy, layout)
            y, ya = (to_device(np.full(y_shape, np.nan, BF16), layout) for _ in range(2))
            gx, gxa = (to_device(np.full(shape, np.nan, BF16), layout) for _ in range(2))
            arg = to_device(np.full(y_shape, 77, np.uint8), layout)
            calls = [(lambda *a: cuda_pool.maxpool2d_forward(*a, spec), (x, y, arg)),
                     (lambda *a: cuda_pool.maxpool2d_backward(*a, spec), (gy, arg, gx)),
                     (lambda *a: cuda_pool.avgpool2d_forward(*a, spec), (x, ya)),
                     (lambda *a: cuda_pool.avgpool2d_backward(*a, spec), (gy, gxa))]
            for call, arrays in calls:
                got, want = bf16_contract(call, *arrays)
                for g, w in zip(got, want):
                    np.testing.assert_array_equal(g, w, err_msg=f"{shape} {kind}")



def _max_pool_nhwc(x, gy, spec, offset=0):
    """Max-pool forward and backward on channels-last copies of x and gy (logical NCHW device
    arrays) whose memory starts `offset` values past an aligned address: (y, argmax, gx)."""
    def place(a, dtype=None):
        dtype = np.dtype(dtype or a.dtype)
        n, c, h, w = a.shape
        flat = cp.empty(a.size + offset, dtype)[offset:]
        out = flat.reshape(n, h, w, c).transpose(0, 3, 1, 2)
        if a.dtype == dtype:
            out[...] = a
        return out
    y, arg = place(gy), place(gy, np.uint8)
    cuda_pool.maxpool2d_forward(place(x), y, arg, spec)
    gx = place(x)
    cuda_pool.maxpool2d_backward(place(gy), arg, gx, spec)
    return [cp.ascontiguousarray(a) for a in (y, arg, gx)]


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=str)
@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_vector_kernels_give_the_bits_of_the_per_value_ones(spec, dtype, monkeypatch):
    """The channels-last max-pool kernels that move a 16-byte vector of channels per thread
    (channels a multiple of it, maps aligned) against the per-value ones, bit for bit; maps
    that start off a vector's alignment run the per-value kernels."""
    rng = np.random.default_rng(21)
    for shape in [(2, 16, 9, 8), (1, 32, 17, 13), (3, 8, 4, 6)]:
        y_shape = out_shape(shape, spec)
        if min(y_shape[2:]) < 1:
            continue
        for kind in ("ties", "special"):
            x = cp.asarray(make_data(rng, shape, np.float32, kind).astype(dtype))
            gy = cp.asarray(make_data(rng, y_shape, np.float32, "special").astype(dtype))
            vector = _max_pool_nhwc(x, gy, spec)
            off_alignment = _max_pool_nhwc(x, gy, spec, offset=1)
            with monkeypatch.context() as m:
                m.setattr(cuda_pool, "_vector", lambda *a: 1)
                per_value = _max_pool_nhwc(x, gy, spec)
            for name, a, b, c in zip(("y", "argmax", "gx"), vector, per_value, off_alignment):
                assert same_bits(a, b) and same_bits(c, b), f"{spec} {shape} {kind}: {name}"
