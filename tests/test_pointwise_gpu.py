"""ReLU, the bias add, the add and dropout's scale_by_mask as raw kernels
(kernels/cuda_pointwise.py) against NumPy, bit for bit: both vector widths (16-byte vectors and
single values), both dtypes, in place, arrays split over several launches, and the checks on
bad input; on bf16 maps, against their contract (the float32 kernel on the widened maps, each
output rounded once). Skipped without a CUDA GPU."""
import inspect

import numpy as np
import pytest

from minidnn.kernels import mapformat

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")
pw = pytest.importorskip("minidnn.kernels.cuda_pointwise")

BF16 = mapformat.bfloat16()

# Sizes: vectors with a partial last mask word; odd (single values); several 256-thread blocks
# with a partial last warp; whole words.
SIZES = (120, 1001, 3 * 7 * 11 * 13, 4096)


def on_device(host, offset=0):
    """A device copy of `host` starting `offset` values into a fresh allocation (offset 1
    misaligns it for the 16-byte vectors)."""
    buf = cp.empty(host.size + offset, host.dtype)
    out = buf[offset:offset + host.size].reshape(host.shape)
    out[...] = cp.asarray(host)
    return out


def signed_values(n, dtype, seed=0):
    """Random values with exact zeros and negative zeros among them."""
    v = np.random.default_rng(seed).standard_normal(n).astype(dtype)
    v[::7] = 0.0
    v[3::11] = -0.0
    return v


def packbits(positive) -> np.ndarray:
    """The mask layout: bit i % 8 of byte i // 8, padded with zero bits to whole 32-bit words."""
    mask = np.packbits(positive, bitorder="little")
    return np.concatenate([mask, np.zeros((-mask.size) % 4, np.uint8)])


def same_bits(got, want) -> bool:
    got, want = np.ascontiguousarray(cp.asnumpy(got)), np.ascontiguousarray(want)
    return got.dtype == want.dtype and got.shape == want.shape and \
        got.view(np.uint8).tobytes() == want.view(np.uint8).tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, BF16])
def test_vector_width_follows_alignment_and_size(dtype):
    vec = 16 // np.dtype(dtype).itemsize
    x = cp.zeros(64, dtype)
    assert pw._vector((x,), x.size) == vec
    assert pw._vector((x[1:],), x.size - 1) == 1                       # misaligned, odd
    assert pw._vector((x[vec:],), x.size - vec) == vec
    assert pw._vector((x, x[1:vec * 8 + 1]), vec * 8) == 1             # one operand misaligned
    assert pw._vector((x,), x.size, unit=vec + 1) == 1                 # planes not whole vectors


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("offset", [0, 1])
def test_relu(dtype, n, offset):
    x = signed_values(n, dtype)
    y_want = np.where(x > 0, x, 0).astype(dtype)
    gy = signed_values(n, dtype, seed=1)
    gx_want = np.where(y_want > 0, gy, 0).astype(dtype)

    dx, dy = on_device(x, offset), on_device(np.full(n, np.nan, dtype), offset)
    pw.relu_forward(dx, dy)
    assert same_bits(dy, y_want)
    dgy, dgx = on_device(gy, offset), on_device(np.full(n, np.nan, dtype), offset)
    pw.relu_backward(dy, dgy, dgx)
    assert same_bits(dgx, gx_want)

    pw.relu_forward(dx, dx)                     # in place
    assert same_bits(dx, y_want)
    pw.relu_backward(dy, dgy, dgy)
    assert same_bits(dgy, gx_want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("offset", [0, 1])
def test_relu_bits(dtype, n, offset):
    x = signed_values(n, dtype).reshape(1, -1)
    y_want = np.where(x > 0, x, 0).astype(dtype)
    mask_want = packbits(x.reshape(-1) > 0)
    gy = signed_values(n, dtype, seed=2).reshape(1, -1)
    gx_want = np.where(x > 0, gy, 0).astype(dtype)

    dx, dy = on_device(x, offset), on_device(np.full(x.shape, np.nan, dtype), offset)
    mask = cp.full(mask_want.size, 0xAB, np.uint8)           # poisoned
    pw.relu_forward_bits(dx, dy, mask)
    assert same_bits(dy, y_want)
    assert same_bits(mask, mask_want)
    dgy, dgx = on_device(gy, offset), on_device(np.full(x.shape, np.nan, dtype), offset)
    pw.relu_backward_bits(mask, dgy, dgx)
    assert same_bits(dgx, gx_want)

    mask[...] = 0xAB
    pw.relu_forward_bits(dx, dx, mask)          # in place
    assert same_bits(dx, y_want) and same_bits(mask, mask_want)
    pw.relu_backward_bits(mask, dgy, dgy)
    assert same_bits(dgy, gx_want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2, 5, 4, 3), (3, 7, 11, 13), (4, 3, 2, 1), (5, 6, 8),
                                   (64, 17)])
@pytest.mark.parametrize("offset", [0, 1])
def test_bias_add(dtype, shape, offset):
    rng = np.random.default_rng(3)
    y = rng.standard_normal(shape).astype(dtype)
    b = rng.standard_normal(shape[1]).astype(dtype)
    want = y + b.reshape((1, -1) + (1,) * (len(shape) - 2))
    dy = on_device(y, offset)
    pw.bias_add(dy, cp.asarray(b))
    assert same_bits(dy, want)


def test_bias_add_strided_goes_through_cupy():
    y = np.arange(2 * 3 * 4 * 6, dtype=np.float32).reshape(2, 3, 4, 6)
    b = np.array([0.5, -1.0, 2.25], np.float32)
    dy = cp.asarray(y)
    pw.bias_add(dy[..., ::2], cp.asarray(b))
    want = y.copy()
    want[..., ::2] += b.reshape(1, -1, 1, 1)
    assert same_bits(dy, want)


def test_several_launches_give_the_same_bits(monkeypatch):
    """Arrays over the launch size run as several launches; with the size made small (one
    vector-aligned piece = 64 values, the bias add's pieces not a multiple of the channels),
    the results stay exact."""
    n = 64 * 5 + 32
    x = signed_values(n, np.float32)
    y_want = np.where(x > 0, x, 0).astype(np.float32)
    y = np.random.default_rng(4).standard_normal((3, 5, 4, 8)).astype(np.float32)
    b = np.random.default_rng(5).standard_normal(5).astype(np.float32)
    monkeypatch.setattr(pw, "_CHUNK", 64)
    dx, dy, mask = cp.asarray(x), cp.empty(n, np.float32), cp.zeros(n // 8, np.uint8)
    pw.relu_forward_bits(dx, dy, mask)
    assert same_bits(dy, y_want) and same_bits(mask, packbits(x > 0))
    dg = cp.asarray(x)
    pw.relu_backward_bits(mask, dg, dg)
    assert same_bits(dg, np.where(x > 0, x, 0).astype(np.float32))
    pw.relu_forward(dx, dx)
    assert same_bits(dx, y_want)
    by = cp.asarray(y)                                  # 2 planes of 32 values per launch
    pw.bias_add(by, cp.asarray(b))
    assert same_bits(by, y + b.reshape(1, -1, 1, 1))


def test_bad_input_is_refused():
    x = cp.zeros((4, 8), np.float32)
    with pytest.raises(TypeError):
        pw.relu_forward(x.astype(np.float16), x.astype(np.float16))
    with pytest.raises(TypeError):
        pw.relu_forward(x, x.astype(np.float64))
    with pytest.raises(ValueError):
        pw.relu_forward(x[:, ::2], x[:, ::2])
    with pytest.raises(ValueError):
        pw.relu_forward(x, x[:2])
    with pytest.raises(ValueError):
        pw.relu_forward_bits(x, x, cp.zeros(3, np.uint8))        # a 32-value mask needs 4 bytes
    with pytest.raises(TypeError):
        pw.relu_backward_bits(cp.zeros(1, np.uint32), x, x)
    with pytest.raises(ValueError):
        pw.bias_add(x, cp.zeros(3, np.float32))


def _last(a):
    """a's values in a channels-last device array of the same logical shape."""
    return cp.ascontiguousarray(cp.asarray(a).transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2, 64, 5, 7), (3, 5, 4, 3), (1, 12, 9, 11)])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("bits", [False, True])
def test_relu_with_a_bias_gives_the_bits_of_the_bias_add_then_the_relu(dtype, shape, layout,
                                                                      bits, monkeypatch):
    """The fused pass (minidnn/fusion.py) against the two passes it replaces, in place and
    not, over one launch and several (with whole mask words per launch)."""
    rng = np.random.default_rng(5)
    x = signed_values(int(np.prod(shape)), dtype, seed=6).reshape(shape)
    b = cp.asarray(rng.standard_normal(shape[1]).astype(dtype))
    lay = _last if layout == "nhwc" else (lambda a: cp.asarray(a).copy())
    nbytes = (x.size + 31) // 32 * 4
    want, want_mask = lay(x), cp.zeros(nbytes, cp.uint8)
    pw.bias_add(want, b)
    (pw.relu_forward_bits(want, want, want_mask) if bits else pw.relu_forward(want, want))
    for per_launch in (None, 64 * shape[1]):
        if per_launch:
            monkeypatch.setattr(pw, "_CHUNK", per_launch)
        for in_place in (False, True):
            src = lay(x)
            out = src if in_place else lay(np.full(shape, np.nan, dtype))
            mask = cp.full(nbytes, 0xAB, cp.uint8)
            if bits:
                pw.relu_forward_bits(src, out, mask, b)
                assert cp.array_equal(mask, want_mask)
            else:
                pw.relu_forward(src, out, b)
            assert same_bits(out, cp.asnumpy(cp.ascontiguousarray(want)))
            if not in_place:
                assert same_bits(src, x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2, 64, 5, 7), (3, 5, 4, 3), (1, 40, 9, 11), (4, 96, 33, 17)])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("bits", [False, True])
def test_relu_backward_with_a_bias_gradient_gives_the_bits_of_the_two_passes(dtype, shape,
                                                                            layout, bits):
    """The ReLU's backward that also sums the gradient of the bias it added (one pass on
    channels-last maps) against relu_backward then bias_grad, in place and not, and the bias
    gradient against NumPy within rounding."""
    rng = np.random.default_rng(8)
    y = np.maximum(signed_values(int(np.prod(shape)), dtype, seed=9), 0).reshape(shape)
    gy = rng.standard_normal(shape).astype(dtype)
    lay = _last if layout == "nhwc" else (lambda a: cp.asarray(a).copy())
    mask = cp.asarray(packbits((y > 0).ravel() if layout == "nchw"
                               else (y.transpose(0, 2, 3, 1) > 0).ravel()))
    want_gx, want_gb = lay(gy), cp.empty(shape[1], dtype)
    if bits:
        pw.relu_backward_bits(mask, want_gx, want_gx)
    else:
        pw.relu_backward(lay(y), want_gx, want_gx)
    pw.bias_grad(want_gx, want_gb)
    for in_place in (False, True):
        g = lay(gy)
        gx = g if in_place else lay(np.full(shape, np.nan, dtype))
        gb = cp.full(shape[1], np.nan, dtype)
        if bits:
            pw.relu_backward_bits(mask, g, gx, gb)
        else:
            pw.relu_backward(lay(y), g, gx, gb)
        assert same_bits(gx, cp.asnumpy(cp.ascontiguousarray(want_gx)))
        assert same_bits(gb, cp.asnumpy(want_gb))
    exact = (gy * (y > 0)).sum(axis=(0, 2, 3), dtype=np.float64)
    np.testing.assert_allclose(cp.asnumpy(want_gb), exact, rtol=1e-5 if dtype == np.float32
                               else 1e-12, atol=1e-4 if dtype == np.float32 else 1e-10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, BF16])
@pytest.mark.parametrize("shape", [(16, 64, 30, 30), (3, 24, 7, 9), (5, 520, 6, 6)])
@pytest.mark.parametrize("mode", ["sums", "relu", "relu bits"])
def test_column_passes_give_the_same_bits_with_and_without_vectors(dtype, shape, mode,
                                                                   monkeypatch):
    """A bias gradient (alone, or in the ReLU's backward, with y or with its mask) summed by
    threads holding 16-byte vectors of channels and by threads holding one channel: the same
    sums in the same order, so the same bits, over many blocks (14,400 pixels: 8 rows each)
    and more than 32 column groups (520 channels); and the gradient written the same."""
    host = bf16_maps(shape, 30) if dtype == BF16 else \
        signed_values(int(np.prod(shape)), dtype, seed=30).reshape(shape)
    y_host = np.maximum(host, host.dtype.type(0))
    mask = cp.asarray(packbits(y_host.transpose(0, 2, 3, 1).ravel() > 0))
    gy_host = bf16_maps(shape, 31) if dtype == BF16 else \
        signed_values(int(np.prod(shape)), dtype, seed=31).reshape(shape)
    acc = np.float32 if dtype == BF16 else dtype

    def run():
        gy, y = to_device(gy_host, "nhwc"), to_device(y_host, "nhwc")
        gb = cp.full(shape[1], np.nan, acc)
        {"sums": lambda: pw.bias_grad(gy, gb),
         "relu": lambda: pw.relu_backward(y, gy, gy, gb),
         "relu bits": lambda: pw.relu_backward_bits(mask, gy, gy, gb)}[mode]()
        return host_bits(gy), cp.asnumpy(gb)

    vector_gx, vector_gb = run()
    monkeypatch.setattr(pw, "_VECTOR_BYTES", np.dtype(dtype).itemsize)   # one value a thread
    single_gx, single_gb = run()
    assert same_bits(vector_gb, single_gb) and same_bits(vector_gx, single_gx)
    kept = gy_host.astype(np.float64) * (1 if mode == "sums" else y_host > 0)
    bound = (1e-12 if dtype == np.float64 else 1e-5) * np.abs(kept).sum(axis=(0, 2, 3))
    assert np.all(np.abs(vector_gb - kept.sum(axis=(0, 2, 3))) <= bound)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, layout", [((2, 64, 5, 7), "nchw"), ((2, 64, 5, 7), "nhwc"),
                                           ((3, 5, 4, 3), "nchw"), ((3, 5, 4, 3), "nhwc"),
                                           ((1001,), "nchw"), ((7, 130), "nchw")])
def test_the_add_kernel_gives_the_bits_of_cupys_add(dtype, shape, layout, monkeypatch):
    """The vectorized add (residual adds, gradient sums at forks) against CuPy's, into a third
    array and in place over either operand, misaligned and over several launches (channels
    last for 4-D maps only)."""
    n = int(np.prod(shape))
    a_host = signed_values(n, dtype, seed=10).reshape(shape)
    b_host = signed_values(n, dtype, seed=11).reshape(shape)
    lay = _last if layout == "nhwc" else (lambda h: on_device(h))
    want = cp.asnumpy(cp.asarray(a_host) + cp.asarray(b_host))
    for per_launch in (None, 64):
        if per_launch:
            monkeypatch.setattr(pw, "_CHUNK", per_launch)
        a, b = lay(a_host), lay(b_host)
        out = lay(np.full(shape, np.nan, dtype))
        pw.add(a, b, out)
        assert same_bits(out, want)
        pw.add(a, b, a)
        assert same_bits(a, want)
        a = lay(a_host)
        pw.add(a, b, b)
        assert same_bits(b, want)
    if layout == "nchw":
        a, b, out = (on_device(h, offset=1) for h in (a_host, b_host, np.zeros(shape, dtype)))
        pw.add(a, b, out)                     # misaligned: one value per thread
        assert same_bits(out, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, layout", [((2, 16, 5, 7), "nchw"), ((2, 16, 5, 7), "nhwc"),
                                           ((1001,), "nchw"), ((7, 130), "nchw")])
@pytest.mark.parametrize("mask_dtype", [np.bool_, np.uint8])
def test_scale_by_mask_gives_numpys_bits(dtype, shape, layout, mask_dtype, monkeypatch):
    """Dropout's y = x * mask * scale against cpu.py's NumPy operations (np.multiply, then
    y *= scale in the maps' dtype), into another array and in place, misaligned and over
    several launches."""
    from minidnn.kernels import cpu
    n, scale = int(np.prod(shape)), 1 / 0.7
    x = signed_values(n, dtype, seed=12).reshape(shape)
    keep = (np.random.default_rng(13).random(shape) >= 0.3).astype(mask_dtype)
    want = np.empty_like(x)
    cpu.scale_by_mask(x, keep, want, scale)
    lay = _last if layout == "nhwc" else (lambda h: on_device(h))
    for per_launch in (None, 64):
        if per_launch:
            monkeypatch.setattr(pw, "_CHUNK", per_launch)
        dx, dkeep, dy = lay(x), lay(keep), lay(np.full(shape, np.nan, dtype))
        pw.scale_by_mask(dx, dkeep, dy, scale)
        assert same_bits(cp.ascontiguousarray(dy), want)
        pw.scale_by_mask(dx, dkeep, dx, scale)
        assert same_bits(cp.ascontiguousarray(dx), want)
    if layout == "nchw":
        dx, dkeep, dy = (on_device(h, offset=1) for h in (x, keep, np.zeros(shape, dtype)))
        pw.scale_by_mask(dx, dkeep, dy, scale)            # misaligned: one value per thread
        assert same_bits(dy, want)
    else:
        dx, dy = lay(x), lay(np.zeros(shape, dtype))
        pw.scale_by_mask(dx, cp.asarray(keep), dy, scale)   # layouts differ: CuPy's strides
        assert same_bits(cp.ascontiguousarray(dy), want)


# ---- bf16 maps ---------------------------------------------------------------------------------
def bf16_maps(shape, seed):
    """Random bf16 values: normal ones, integers up to 300 (their sums and means often fall
    exactly halfway between two bf16 values, where rounding goes to the even one), zeros of
    both signs."""
    rng = np.random.default_rng(seed)
    v = rng.standard_normal(shape).astype(np.float32)
    flat = v.reshape(-1)
    flat[::3] = rng.integers(-300, 301, flat[::3].size)
    flat[::7] = 0.0
    flat[3::11] = -0.0
    return v.astype(BF16)


def to_device(host, layout="nchw"):
    """A device copy of host array `host` in `layout` ('nhwc': channels last), a bf16 one
    moved as its raw bits."""
    bits = host.view(np.uint16) if host.dtype == BF16 else host
    dev = _last(bits) if layout == "nhwc" else cp.asarray(bits)
    return dev.view(host.dtype)


def host_bits(a):
    """A device array's values on the host (C order), bf16 as their raw uint16 bits."""
    return cp.asnumpy(cp.ascontiguousarray(a.view(np.uint16) if a.dtype == BF16 else a))


def bf16_contract(call, *arrays):
    """(got, want) for call(*arrays) on device arrays whose maps are bf16: got, every array
    after the call; want, after the same call on float32 widenings of the bf16 arrays
    (bf16_to_float, exact; the others copied), each then rounded to bf16 once (float_to_bf16).
    Both as host_bits."""
    wide = []
    for a in arrays:
        if a.dtype == BF16:
            w = cp.empty_like(a, dtype=np.float32)
            pw.bf16_to_float(a, w)
        else:
            w = a.copy(order="K")
        wide.append(w)
    call(*wide)
    want = []
    for a, w in zip(arrays, wide):
        if a.dtype == BF16:
            w, wide32 = cp.empty_like(a), w
            pw.float_to_bf16(wide32, w)
        want.append(host_bits(w))
    call(*arrays)
    return [host_bits(a) for a in arrays], want


SCALE = 1 / 0.7
# Every bf16 kernel path, as a call on operands named by its parameters (bf16_operands): x, a
# second map g, y = max(x, 0), mask = the bits of x > 0, keep (dropout's), out (a map the call
# writes), the bias b and its gradient gb (float32).
BF16_CALLS = {
    "relu_forward": lambda x, out: pw.relu_forward(x, out),
    "relu_forward in place": lambda x: pw.relu_forward(x, x),
    "relu_forward bias": lambda x, out, b: pw.relu_forward(x, out, b),
    "relu_forward bias in place": lambda x, b: pw.relu_forward(x, x, b),
    "relu_forward_bits": lambda x, out, mask: pw.relu_forward_bits(x, out, mask),
    "relu_forward_bits bias": lambda x, out, mask, b: pw.relu_forward_bits(x, out, mask, b),
    "relu_backward": lambda y, g, out: pw.relu_backward(y, g, out),
    "relu_backward gb": lambda y, g, out, gb: pw.relu_backward(y, g, out, gb),
    "relu_backward gb in place": lambda y, g, gb: pw.relu_backward(y, g, g, gb),
    "relu_backward_bits": lambda mask, g, out: pw.relu_backward_bits(mask, g, out),
    "relu_backward_bits gb": lambda mask, g, out, gb: pw.relu_backward_bits(mask, g, out, gb),
    "bias_grad": lambda g, gb: pw.bias_grad(g, gb),
    "bias_add": lambda x, b: pw.bias_add(x, b),
    "add": lambda x, g, out: pw.add(x, g, out),
    "add in place": lambda x, g: pw.add(x, g, g),
    "scale_by_mask": lambda x, keep, out: pw.scale_by_mask(x, keep, out, SCALE),
    "scale_by_mask in place": lambda x, keep: pw.scale_by_mask(x, keep, x, SCALE),
}


def bf16_operands(shape, layout, seed=20) -> dict:
    rng = np.random.default_rng(seed)
    x = bf16_maps(shape, seed)
    order = x.transpose(0, 2, 3, 1) if layout == "nhwc" else x        # memory order
    bias = rng.standard_normal(shape[1]).astype(np.float32)
    bias[::2] = rng.integers(-4, 4, bias[::2].size) + 0.5      # x + 0.5 ties for odd integers
    return {"x": to_device(x, layout), "g": to_device(bf16_maps(shape, seed + 1), layout),
            "y": to_device(np.maximum(x, BF16.type(0)), layout),
            "mask": cp.asarray(packbits(order.ravel() > 0)),
            "keep": to_device(rng.random(shape) >= 0.3, layout),
            "out": to_device(np.full(shape, np.nan, BF16), layout),
            "b": cp.asarray(bias), "gb": cp.full(shape[1], np.nan, np.float32)}


@pytest.mark.parametrize("call", BF16_CALLS, ids=str)
@pytest.mark.parametrize("shape", [(2, 16, 5, 7), (3, 24, 4, 4), (2, 5, 3, 3)])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("per_launch", [None, 64])
def test_bf16_kernels_keep_the_contract(call, shape, layout, per_launch, monkeypatch):
    """Each kernel on bf16 maps (float32 bias and bias gradient) against the float32 kernel on
    the widened maps with each bf16 output rounded once, bit for bit, the bias gradient too
    (the same float32 values summed in the same order): vectors of 8 and single values (C = 5,
    90 values), NCHW and channels last, one launch and several."""
    if per_launch:
        monkeypatch.setattr(pw, "_CHUNK", per_launch)
    operands = bf16_operands(shape, layout)
    fn = BF16_CALLS[call]
    got, want = bf16_contract(fn, *(operands[p] for p in inspect.signature(fn).parameters))
    for g, w in zip(got, want):
        assert same_bits(g, w)


def test_bf16_dtype_mixes_are_refused():
    x = to_device(bf16_maps((2, 8, 3, 3), 0), "nhwc")
    c = x.shape[1]
    with pytest.raises(ValueError, match="float32"):
        pw.bias_add(x, cp.zeros(c, BF16))                      # a bias beside bf16 maps: float32
    with pytest.raises(ValueError, match="float32"):
        pw.relu_forward(x, x, cp.zeros(c, np.float64))
    with pytest.raises(TypeError, match="float32"):
        pw.bias_grad(x, cp.zeros(c, BF16))                      # so is its gradient
    with pytest.raises(TypeError):
        pw.relu_forward(x, cp.zeros_like(x, dtype=np.float32))  # maps of one dtype
    with pytest.raises(TypeError):
        pw.scale_by_mask(x, cp.ones_like(x, dtype=np.float32), x, 2.0)   # a bool or uint8 mask

