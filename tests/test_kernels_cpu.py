"""The NumPy reference kernels against independent naive implementations.

The naive versions loop explicitly over output positions on tiny shapes and share no code with
minidnn/kernels/cpu.py; backward ops are checked through the adjoint identity
<A x, g> = <x, A^T g> of the linear maps they are transposes of.
"""
import itertools

import numpy as np
import pytest

from minidnn.kernels import ConvSpec, LRNSpec, PoolSpec, cpu, out_size


# ---- naive references ---------------------------------------------------------------------------
def naive_conv(x, w, b, stride, padding, dilation, groups):
    """Direct-sum convolution in float64, one output value at a time."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    og = o // groups
    y = np.zeros((n, o, oh, ow))
    for b_, oc, i, j in itertools.product(range(n), range(o), range(oh), range(ow)):
        g = oc // og
        total = 0.0 if b is None else float(b[oc])
        for ci, u, v in itertools.product(range(cg), range(kh), range(kw)):
            r, s = i * sh - ph + u * dh, j * sw - pw + v * dw
            if 0 <= r < h and 0 <= s < wd:
                total += float(x[b_, g * cg + ci, r, s]) * float(w[oc, ci, u, v])
        y[b_, oc, i, j] = total
    return y


def naive_windows(h, w, kernel, stride, padding, ceil_mode):
    """Yield (i, j, [(kh*KW+kw, r, s) inside the padded window], rows_hi, cols_hi) per output,
    where *_hi is the end of the window clipped to input + padding (PyTorch's pool_size)."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding

    def count(size, k, s, p):
        span = size + 2 * p - k
        out = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (out - 1) * s >= size + p:
            out -= 1
        return out
    oh, ow = count(h, kh, sh, ph), count(w, kw, sw, pw)
    for i in range(oh):
        for j in range(ow):
            r0, s0 = i * sh - ph, j * sw - pw
            cells = [(u * kw + v, r0 + u, s0 + v) for u in range(kh) for v in range(kw)]
            yield i, j, cells, (r0, min(r0 + kh, h + ph)), (s0, min(s0 + kw, w + pw))


def naive_maxpool(x, kernel, stride, padding, ceil_mode):
    n, c, h, w = x.shape
    wins = list(naive_windows(h, w, kernel, stride, padding, ceil_mode))
    oh, ow = wins[-1][0] + 1, wins[-1][1] + 1
    y = np.zeros((n, c, oh, ow), dtype=x.dtype)
    arg = np.zeros((n, c, oh, ow), dtype=np.uint8)
    for b, ch in itertools.product(range(n), range(c)):
        for i, j, cells, _, _ in wins:
            best, best_k = None, None
            for k, r, s in cells:
                if 0 <= r < h and 0 <= s < w and (best is None or x[b, ch, r, s] > best):
                    best, best_k = x[b, ch, r, s], k
            y[b, ch, i, j], arg[b, ch, i, j] = best, best_k
    return y, arg


def naive_avgpool(x, kernel, stride, padding, ceil_mode, count_include_pad):
    n, c, h, w = x.shape
    wins = list(naive_windows(h, w, kernel, stride, padding, ceil_mode))
    oh, ow = wins[-1][0] + 1, wins[-1][1] + 1
    y = np.zeros((n, c, oh, ow))
    for b, ch in itertools.product(range(n), range(c)):
        for i, j, cells, (r0, r1), (s0, s1) in wins:
            vals = [float(x[b, ch, r, s]) for _, r, s in cells if 0 <= r < h and 0 <= s < w]
            if count_include_pad:
                div = (r1 - r0) * (s1 - s0)
            else:
                div = (min(r1, h) - max(r0, 0)) * (min(s1, w) - max(s0, 0))
            y[b, ch, i, j] = sum(vals) / div
    return y


def naive_lrn(x, size, alpha, beta, k):
    """PyTorch's LocalResponseNorm, written out channel by channel."""
    n, c = x.shape[:2]
    y = np.zeros(x.shape)
    scale = np.zeros(x.shape)
    for ch in range(c):
        lo, hi = ch - size // 2, ch + (size - 1) // 2
        total = sum(x[:, cc].astype(np.float64) ** 2 for cc in range(max(lo, 0), min(hi, c - 1) + 1))
        scale[:, ch] = k + alpha / size * total
        y[:, ch] = x[:, ch] / scale[:, ch] ** beta
    return y, scale


# ---- convolution --------------------------------------------------------------------------------
CONV_CASES = [
    # (N, C, H, W), (O, KH, KW), stride, padding, dilation, groups
    ((2, 3, 7, 6), (4, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((2, 4, 9, 8), (6, 3, 2), (2, 3), (1, 0), (1, 1), 2),
    ((1, 4, 8, 9), (4, 3, 3), (1, 2), (2, 1), (2, 1), 4),   # depthwise, dilated
    ((3, 2, 5, 5), (3, 1, 1), (1, 1), (0, 0), (1, 1), 1),   # 1x1
    ((2, 3, 11, 11), (2, 5, 5), (4, 4), (2, 2), (1, 1), 1),  # AlexNet-like stride
    ((1, 6, 6, 7), (6, 2, 4), (2, 1), (0, 2), (2, 1), 3),
]


def _conv_setup(case, dtype, seed=0):
    xs, (o, kh, kw), stride, padding, dilation, groups = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal((o, xs[1] // groups, kh, kw)).astype(dtype)
    b = rng.standard_normal(o).astype(dtype)
    spec = ConvSpec(stride=stride, padding=padding, dilation=dilation, groups=groups)
    oh = out_size(xs[2], kh, stride[0], padding[0], dilation[0])
    ow = out_size(xs[3], kw, stride[1], padding[1], dilation[1])
    return x, w, b, spec, (xs[0], o, oh, ow)


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv_forward_matches_direct_sum(case, dtype):
    x, w, b, spec, yshape = _conv_setup(case, dtype)
    for bias in (b, None):
        y = np.full(yshape, np.nan, dtype=dtype)
        cpu.conv2d_forward(x, w, bias, y, spec)
        ref = naive_conv(x, w, bias, spec.stride, spec.padding, spec.dilation, spec.groups)
        assert y.dtype == dtype
        tol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(y, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_backward_ops_are_the_adjoints(case):
    """<conv(x), gy> = <x, backward_data(gy)> = <w, backward_filter(x, gy)>, bias grad = sum gy."""
    x, w, b, spec, yshape = _conv_setup(case, np.float64, seed=1)
    rng = np.random.default_rng(2)
    gy = rng.standard_normal(yshape)
    y = np.empty(yshape)
    cpu.conv2d_forward(x, w, None, y, spec)
    gx = np.full(x.shape, np.nan)
    cpu.conv2d_backward_data(gy, w, gx, spec)
    gw, gb = np.full(w.shape, np.nan), np.full(b.shape, np.nan)
    cpu.conv2d_backward_filter(x, gy, gw, gb, spec)
    inner = float(np.sum(y * gy))
    assert np.isclose(inner, float(np.sum(x * gx)), rtol=1e-10)
    assert np.isclose(inner, float(np.sum(w * gw)), rtol=1e-10)
    np.testing.assert_allclose(gb, gy.sum(axis=(0, 2, 3)), rtol=1e-12)


@pytest.mark.parametrize("case", [CONV_CASES[1], CONV_CASES[4]])
def test_conv_batch_chunks_give_the_same_result(case, monkeypatch):
    """A tiny temporary budget forces one image per chunk; the numbers must not change."""
    x, w, b, spec, yshape = _conv_setup(case, np.float64, seed=3)
    gy = np.random.default_rng(4).standard_normal(yshape)

    def run():
        y, gx, gw, gb = np.empty(yshape), np.empty(x.shape), np.empty(w.shape), np.empty(b.shape)
        cpu.conv2d_forward(x, w, b, y, spec)
        cpu.conv2d_backward_data(gy, w, gx, spec)
        cpu.conv2d_backward_filter(x, gy, gw, gb, spec)
        return y, gx, gw, gb
    whole = run()
    monkeypatch.setattr(cpu, "TEMP_BUDGET", 1)
    for a, b_ in zip(whole, run()):
        np.testing.assert_allclose(a, b_, rtol=1e-12, atol=1e-12)


def test_conv_writes_non_contiguous_weight_gradient():
    x, w, b, spec, yshape = _conv_setup(CONV_CASES[0], np.float64)
    gy = np.ones(yshape)
    full = np.empty(w.shape)
    cpu.conv2d_backward_filter(x, gy, full, None, spec)
    strided = np.full((w.shape[0] * 2,) + w.shape[1:], np.nan)[::2]   # not C-contiguous
    cpu.conv2d_backward_filter(x, gy, strided, None, spec)
    np.testing.assert_array_equal(strided, full)


# ---- pooling ------------------------------------------------------------------------------------
POOL_CASES = [
    # (N, C, H, W), kernel, stride, padding, ceil_mode
    ((2, 3, 8, 8), (2, 2), (2, 2), (0, 0), False),
    ((2, 2, 9, 9), (3, 3), (2, 2), (0, 0), False),   # overlapping, AlexNet's pool
    ((1, 2, 8, 10), (3, 3), (2, 2), (1, 1), False),
    ((2, 2, 8, 8), (3, 3), (2, 2), (0, 0), True),    # ceil_mode: last window cut off
    ((1, 3, 7, 6), (3, 2), (2, 3), (1, 1), True),
    ((1, 1, 5, 5), (2, 2), (3, 3), (1, 0), True),
]


def _pool_spec(case, count_include_pad=True):
    _, kernel, stride, padding, ceil_mode = case
    return PoolSpec(kernel=kernel, stride=stride, padding=padding, ceil_mode=ceil_mode,
                    count_include_pad=count_include_pad)


def _pool_out(case):
    xs, kernel, stride, padding, ceil_mode = case
    return xs[:2] + tuple(out_size(s, k, st, p, ceil_mode=ceil_mode)
                          for s, k, st, p in zip(xs[2:], kernel, stride, padding))


@pytest.mark.parametrize("case", POOL_CASES)
def test_maxpool_forward_and_argmax(case):
    x = np.random.default_rng(0).standard_normal(case[0]).astype(np.float32)
    ref_y, ref_arg = naive_maxpool(x, *case[1:])
    y = np.full(_pool_out(case), np.nan, dtype=np.float32)
    arg = np.full(y.shape, 255, dtype=np.uint8)
    cpu.maxpool2d_forward(x, y, arg, _pool_spec(case))
    np.testing.assert_array_equal(y, ref_y)
    np.testing.assert_array_equal(arg, ref_arg)


@pytest.mark.parametrize("case", POOL_CASES)
def test_maxpool_argmax_with_many_ties(case):
    """Values from {-1, 0, 1}: most windows hold several maxima; the first must win."""
    x = np.random.default_rng(9).integers(-1, 2, case[0]).astype(np.float32)
    ref_y, ref_arg = naive_maxpool(x, *case[1:])
    y = np.empty(_pool_out(case), dtype=np.float32)
    arg = np.empty(y.shape, dtype=np.uint8)
    cpu.maxpool2d_forward(x, y, arg, _pool_spec(case))
    np.testing.assert_array_equal(y, ref_y)
    np.testing.assert_array_equal(arg, ref_arg)


def test_maxpool_ties_go_to_the_first_and_padding_never_wins():
    x = np.full((1, 1, 4, 4), -5.0, dtype=np.float32)
    x[0, 0, 1, 1] = x[0, 0, 1, 2] = x[0, 0, 2, 1] = 7.0  # three-way tie in one window
    spec = PoolSpec(kernel=(3, 3), stride=(1, 1), padding=(1, 1))
    y = np.empty((1, 1, 4, 4), dtype=np.float32)
    arg = np.empty(y.shape, dtype=np.uint8)
    cpu.maxpool2d_forward(x, y, arg, spec)
    # Window of output (1, 1) spans rows 0..2, cols 0..2: the tie's first cell is (1, 1) -> 4.
    assert y[0, 0, 1, 1] == 7 and arg[0, 0, 1, 1] == 4
    # Output (0, 0): padded window rows -1..1, cols -1..1; the max 7 sits at offset (2, 2) -> 8.
    assert y[0, 0, 0, 0] == 7 and arg[0, 0, 0, 0] == 8
    # Output (3, 3): all real values are -5 and the first real cell is at offset (0, 0).
    assert y[0, 0, 3, 3] == -5 and arg[0, 0, 3, 3] == 0
    assert np.all(np.isfinite(y))


@pytest.mark.parametrize("case", POOL_CASES)
def test_maxpool_backward_routes_to_the_winner(case):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(case[0])
    y = np.empty(_pool_out(case))
    arg = np.empty(y.shape, dtype=np.uint8)
    spec = _pool_spec(case)
    cpu.maxpool2d_forward(x, y, arg, spec)
    gy = rng.standard_normal(y.shape)
    gx = np.full(x.shape, np.nan)
    cpu.maxpool2d_backward(gy, arg, gx, spec)
    expect = np.zeros(x.shape)
    (kh, kw), (sh, sw), (ph, pw) = case[1], case[2], case[3]
    for b, c, i, j in itertools.product(*map(range, y.shape)):
        u, v = divmod(int(arg[b, c, i, j]), kw)
        expect[b, c, i * sh - ph + u, j * sw - pw + v] += gy[b, c, i, j]
    np.testing.assert_allclose(gx, expect, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avgpool_forward(case, count_include_pad):
    x = np.random.default_rng(2).standard_normal(case[0]).astype(np.float32)
    ref = naive_avgpool(x, *case[1:], count_include_pad)
    y = np.full(_pool_out(case), np.nan, dtype=np.float32)
    cpu.avgpool2d_forward(x, y, _pool_spec(case, count_include_pad))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_avgpool_divisors_follow_pytorch():
    """4x4 input, kernel 3, stride 2, padding 1, ceil_mode: 3x3 outputs, the last row/column of
    windows reaches past the padding. PyTorch divides the corner (0, 0) window by 9 when padding
    counts, by 4 when it does not; the last window (rows 3..5) is cut to rows 3..4 (input + pad):
    2 rows, of which 1 is input."""
    x = np.ones((1, 1, 4, 4))
    spec = PoolSpec(kernel=(3, 3), stride=(2, 2), padding=(1, 1), ceil_mode=True)
    assert out_size(4, 3, 2, 1, ceil_mode=True) == 3
    y = np.empty((1, 1, 3, 3))
    cpu.avgpool2d_forward(x, y, spec)
    assert y[0, 0, 0, 0] == pytest.approx(4 / 9)
    assert y[0, 0, 2, 2] == pytest.approx(1 / 4)        # 1 input value / (2 x 2) window
    cpu.avgpool2d_forward(x, y, PoolSpec(kernel=(3, 3), stride=(2, 2), padding=(1, 1),
                                         ceil_mode=True, count_include_pad=False))
    np.testing.assert_allclose(y, 1.0)                    # a mean of ones is one


@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avgpool_backward_is_the_adjoint(case, count_include_pad):
    rng = np.random.default_rng(3)
    spec = _pool_spec(case, count_include_pad)
    x = rng.standard_normal(case[0])
    y = np.empty(_pool_out(case))
    cpu.avgpool2d_forward(x, y, spec)
    gy = rng.standard_normal(y.shape)
    gx = np.full(x.shape, np.nan)
    cpu.avgpool2d_backward(gy, gx, spec)
    assert np.isclose(float(np.sum(y * gy)), float(np.sum(x * gx)), rtol=1e-10)


@pytest.mark.parametrize("case", [POOL_CASES[2], POOL_CASES[4]])
def test_pool_batch_chunks_give_the_same_result(case, monkeypatch):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3,) + case[0][1:])
    gy = rng.standard_normal((3,) + _pool_out(case)[1:])
    spec = _pool_spec(case, count_include_pad=False)

    def run():
        y, arg, gx = np.empty(gy.shape), np.empty(gy.shape, np.uint8), np.empty(x.shape)
        ya, gxa = np.empty(gy.shape), np.empty(x.shape)
        cpu.maxpool2d_forward(x, y, arg, spec)
        cpu.maxpool2d_backward(gy, arg, gx, spec)
        cpu.avgpool2d_forward(x, ya, spec)
        cpu.avgpool2d_backward(gy, gxa, spec)
        return y, arg, gx, ya, gxa
    whole = run()
    monkeypatch.setattr(cpu, "TEMP_BUDGET", 1)
    for a, b in zip(whole, run()):
        np.testing.assert_array_equal(a, b)


# ---- LRN ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lrn_forward_matches_formula(size, dtype):
    x = np.random.default_rng(size).standard_normal((2, 6, 3, 4)).astype(dtype)
    spec = LRNSpec(size=size, alpha=0.5, beta=0.75, k=1.5)   # large alpha: the window matters
    ref_y, ref_scale = naive_lrn(x, size, spec.alpha, spec.beta, spec.k)
    y = np.full(x.shape, np.nan, dtype=dtype)
    scale = np.full(x.shape, np.nan, dtype=dtype)
    cpu.lrn_forward(x, y, scale, spec)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(scale, ref_scale, rtol=tol)
    np.testing.assert_allclose(y, ref_y, rtol=tol, atol=tol)


def test_lrn_even_size_window_leans_forward():
    """Size 2 covers channels c-1 and c (PyTorch pads 1 in front, 0 behind)."""
    x = np.zeros((1, 3, 1, 1))
    x[0, 1] = 2.0
    y, scale = np.empty(x.shape), np.empty(x.shape)
    cpu.lrn_forward(x, y, scale, LRNSpec(size=2, alpha=1.0, beta=1.0, k=1.0))
    # channel 1's square (4) reaches channel 1 and channel 2, not channel 0.
    np.testing.assert_allclose(scale.ravel(), [1.0, 1.0 + 4 / 2, 1.0 + 4 / 2])


@pytest.mark.parametrize("size", [2, 3, 5])
def test_lrn_backward_matches_jacobian(size):
    """gx = J^T gy with J the LRN's Jacobian built column by column from finite differences."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 5, 2, 1))
    spec = LRNSpec(size=size, alpha=0.8, beta=0.6, k=1.2)
    gy = rng.standard_normal(x.shape)
    y, scale = np.empty(x.shape), np.empty(x.shape)
    cpu.lrn_forward(x, y, scale, spec)
    gx = np.full(x.shape, np.nan)
    cpu.lrn_backward(x, None, scale, gy, gx, spec)
    expect = np.zeros(x.size)
    eps = 1e-6
    for i in range(x.size):
        d = np.zeros(x.size)
        d[i] = eps
        plus, minus = naive_lrn(x + d.reshape(x.shape), size, spec.alpha, spec.beta, spec.k)[0], \
            naive_lrn(x - d.reshape(x.shape), size, spec.alpha, spec.beta, spec.k)[0]
        expect[i] = np.sum(gy * (plus - minus)) / (2 * eps)
    np.testing.assert_allclose(gx.ravel(), expect, rtol=1e-6, atol=1e-8)


def test_relu_bit_mask_layout():
    """Bit i % 8 of byte i // 8 holds value i's y > 0; the bytes after the last value are 0."""
    from minidnn.kernels import relu_mask_bytes
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 5, 7)).astype(np.float32)      # 105 values, 4 words
    y = np.empty_like(x)
    mask = np.full(relu_mask_bytes(x.size), 0xAB, np.uint8)    # poisoned
    cpu.relu_forward_bits(x, y, mask)
    flat = x.ravel()
    for i in range(flat.size):
        assert bool(mask[i // 8] >> (i % 8) & 1) == (flat[i] > 0)
    assert mask.size == 16 and not mask[14:].any() and mask[13] >> 1 == 0
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    gy = rng.standard_normal(x.shape).astype(np.float32)
    gx = np.full_like(gy, np.nan)
    cpu.relu_backward_bits(mask, gy, gx)
    np.testing.assert_array_equal(gx, gy * (x > 0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mask_dtype", [np.bool_, np.uint8])
def test_scale_by_mask(dtype, mask_dtype):
    """y = (x * mask) * scale, each product rounded in the maps' dtype, in any layout (flat
    views where the three share one, strided otherwise), in place too; bf16 maps refused."""
    from minidnn.kernels.mapformat import arrange, bfloat16, shaped
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 4, 5)).astype(dtype)
    keep = (rng.random(x.shape) >= 0.3).astype(mask_dtype)
    want = (x * keep.astype(dtype)) * dtype(1 / 0.7)

    def last(a):
        return shaped(arrange(a, "nhwc").reshape(-1).view(np.uint8), a.shape, a.dtype, "nhwc")
    for lay_x, lay_keep in ((np.copy, np.copy), (last, last), (last, np.copy)):
        y = lay_x(np.full(x.shape, np.nan, dtype))
        cpu.scale_by_mask(lay_x(x), lay_keep(keep), y, 1 / 0.7)
        np.testing.assert_array_equal(y, want)
        xi = lay_x(x)
        cpu.scale_by_mask(xi, lay_keep(keep), xi, 1 / 0.7)
        np.testing.assert_array_equal(xi, want)
    with pytest.raises(TypeError, match="float32 or float64"):
        cpu.scale_by_mask(x.astype(bfloat16()), keep, x.astype(bfloat16()), 2.0)
