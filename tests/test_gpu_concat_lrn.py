"""The GPU's concatenation and LRN kernels (kernels/cuda_concat.py, kernels/cuda_lrn.py)
against NumPy, in both layouts, float32 and bfloat16 maps, odd sizes, run-to-run bits; and
the channels-last 3x3 stride-1 max pooling that covers a run of pixels per thread
(kernels/cuda_pool.py) against the kernels that cover one. Skipped without a CUDA GPU.

A concatenation is a copy: its outputs must be NumPy's bits exactly. LRN is checked against
a float64 reference within the tolerance of the other LRN tests (float32), or of a few bf16
roundings (bf16 maps, whose kernels compute in float32 and round each output once).
"""
import numpy as np
import pytest

from minidnn.kernels import LRNSpec, mapformat

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")
cuda = pytest.importorskip("minidnn.kernels.cuda")
from test_kernels_gpu import ref_lrn, ref_lrn_backward, rel_err  # noqa: E402  (float64)

BF16 = mapformat.bfloat16()


def to_device(a, layout):
    """A host array (any dtype, bf16 included) on the GPU through its raw bytes, channels last
    for 'nhwc' (4-D arrays only)."""
    flat = cp.asarray(mapformat.arrange(a, layout).reshape(-1).view(np.uint8))
    return mapformat.shaped(flat, a.shape, a.dtype, layout)


def to_host(a):
    """A GPU array (any dense layout, any dtype) as a C-contiguous host array, its bytes as
    they are (bf16 through its 16-bit patterns)."""
    flat = cp.asnumpy(mapformat.in_memory_order(a).view(np.uint8)).view(a.dtype)
    if a.ndim == 4 and not a.flags.c_contiguous:
        n, c, h, w = a.shape
        return flat.reshape(n, h, w, c).transpose(0, 3, 1, 2).copy()
    return flat.reshape(a.shape).copy()


def bits(a):
    return a.view(np.uint16) if a.dtype == BF16 else a


# ---- concatenation --------------------------------------------------------------------------
CONCATS = [
    ([(2, 16, 3, 5), (2, 32, 3, 5), (2, 8, 3, 5), (2, 8, 3, 5)], 1),   # 16-byte vectors
    ([(2, 3, 4, 5), (2, 5, 4, 5), (2, 1, 4, 5)], 1),                   # odd channel counts
    ([(3, 6, 2, 2), (3, 2, 2, 2)], 1),                                 # 8-byte words (fp32)
    ([(1, 2, 3, 3)] * 11, 1),                                          # more than PARTS inputs
    ([(2, 3, 4, 5), (2, 3, 3, 5)], 2),
    ([(2, 3, 4, 5), (2, 3, 4, 7)], 3),
]


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shapes, axis", CONCATS, ids=lambda v: str(v))
def test_concat_moves_numpys_bits(shapes, axis, dtype, layout):
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(s).astype(dtype) for s in shapes]
    want = np.concatenate([bits(x) for x in xs], axis=axis)
    y = to_device(np.full(want.shape, np.nan, dtype), layout)
    cuda.concat_forward([to_device(x, layout) for x in xs], y, axis)
    np.testing.assert_array_equal(bits(to_host(y)), want)

    gy = rng.standard_normal(want.shape).astype(dtype)
    sizes = [s[axis] for s in shapes]
    gxs = [to_device(np.full(s, 7, dtype), layout) for s in shapes]
    skipped = len(gxs) // 2                      # a gradient nobody wants stays untouched
    cuda.concat_backward(to_device(gy, layout),
                         [None if k == skipped else g for k, g in enumerate(gxs)], sizes, axis)
    bounds = np.cumsum([0] + sizes)
    for k, g in enumerate(gxs):
        want_k = (np.full(shapes[k], 7, dtype) if k == skipped
                  else np.take(gy, np.arange(bounds[k], bounds[k + 1]), axis=axis))
        np.testing.assert_array_equal(bits(to_host(g)), bits(want_k))


def test_concat_of_strided_views_goes_through_cupy():
    rng = np.random.default_rng(4)
    big = cp.asarray(rng.standard_normal((2, 6, 4, 4)).astype(np.float32))
    xs = [big[:, :, ::2], big[:, :3, 1::2]]          # neither C-contiguous nor channels last
    y = cp.empty((2, 9, 2, 4), np.float32)
    cuda.concat_forward(xs, y, 1)
    np.testing.assert_array_equal(cp.asnumpy(y), np.concatenate([cp.asnumpy(x) for x in xs], 1))


# ---- LRN ------------------------------------------------------------------------------------
GOOGLENET = LRNSpec(size=5, alpha=1e-4, beta=0.75, k=1.0)
LRN_CASES = [
    (GOOGLENET, (2, 64, 3, 5)),          # GoogLeNet's settings, vectors in NHWC
    (GOOGLENET, (2, 13, 3, 3)),          # odd channel count: no vectors
    (LRNSpec(size=5, alpha=0.5, beta=0.75, k=1.0), (2, 9, 4, 3)),   # large alpha: the window
    (LRNSpec(size=4, alpha=0.2, beta=0.6, k=1.0), (1, 7, 5, 6)),    # matters; even size
    (LRNSpec(size=3, alpha=1e-2, beta=1.0, k=2.0), (2, 3, 2, 2)),
    (LRNSpec(size=7, alpha=0.1, beta=0.5, k=1.0), (2, 16, 3, 3)),   # window wider than a run
]


def _lrn(x, gy, spec, layout):
    dx, dgy = to_device(x, layout), to_device(gy, layout)
    y = to_device(np.zeros_like(x), layout)
    scale = to_device(np.zeros(x.shape, np.float32), layout)
    gx = to_device(np.zeros_like(x), layout)
    cuda.lrn_forward(dx, y, scale, spec)
    cuda.lrn_backward(dx, None, scale, dgy, gx, spec)
    return to_host(y), to_host(scale), to_host(gx)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("spec, shape", LRN_CASES, ids=lambda v: str(v))
def test_lrn_against_numpy(spec, shape, dtype, layout):
    rng = np.random.default_rng(6)
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    gy = rng.standard_normal(shape).astype(dtype)
    y, scale, gx = _lrn(x, gy, spec, layout)
    want_y, want_s = ref_lrn(x.astype(np.float64), spec)
    want_gx = ref_lrn_backward(x.astype(np.float64), gy.astype(np.float64), spec)
    tol = 1e-5 if dtype == np.float32 else 3e-2
    assert rel_err(y.astype(np.float32), want_y) < tol
    assert rel_err(scale, want_s) < 1e-5
    assert rel_err(gx.astype(np.float32), want_gx) < tol


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_lrn_bf16_is_the_float32_kernel_rounded_once(layout):
    """On bf16 maps the kernels compute as on float32 maps and round each output once."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((2, 24, 3, 3)) * 3).astype(BF16)
    gy = rng.standard_normal(x.shape).astype(BF16)
    y, scale, gx = _lrn(x, gy, GOOGLENET, layout)
    y32, scale32, gx32 = _lrn(x.astype(np.float32), gy.astype(np.float32), GOOGLENET, layout)
    np.testing.assert_array_equal(bits(y), bits(y32.astype(BF16)))
    np.testing.assert_array_equal(scale, scale32)
    np.testing.assert_array_equal(bits(gx), bits(gx32.astype(BF16)))


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_lrn_gives_the_same_bits_every_run(layout):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 32, 7, 7)).astype(np.float32)
    gy = rng.standard_normal(x.shape).astype(np.float32)
    first = _lrn(x, gy, GOOGLENET, layout)
    for _ in range(2):
        again = _lrn(x, gy, GOOGLENET, layout)
        for a, b in zip(first, again):
            np.testing.assert_array_equal(a, b)


# ---- 3x3 stride-1 max pooling, channels last (inception's pool branch) ------------------------
# (shape, padding) pairs with an output (a 3x3 window fits): 5x2 and 1x6 only when padded.
RUN3_CASES = [(shape, padding)
              for shape in [(2, 16, 7, 9), (1, 8, 5, 2), (3, 32, 1, 6), (1, 64, 4, 4)]
              for padding in [(1, 1), (0, 0)]
              if min(shape[2] + 2 * padding[0], shape[3] + 2 * padding[1]) >= 3]


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape, padding", RUN3_CASES, ids=str)
def test_3x3_stride_1_max_pooling_by_runs_gives_the_per_pixel_kernels_bits(shape, padding,
                                                                           dtype, monkeypatch):
    """The kernels that cover a run of pixels per thread against those that cover one pixel:
    the same bits, ties, NaN, infinities and signed zeros included; widths that are not a
    multiple of the run. bf16 maps run them too here (by default they keep a pixel a thread)."""
    from minidnn.kernels import PoolSpec, cuda_pool
    spec = PoolSpec(kernel=(3, 3), stride=(1, 1), padding=padding)
    n, c, h, w = shape
    oh, ow = h + 2 * padding[0] - 2, w + 2 * padding[1] - 2
    monkeypatch.setattr(cuda_pool, "_RUN3_TYPES", ("float", "bf16"))
    rng = np.random.default_rng(9)
    x = rng.integers(-2, 3, shape).astype(np.float32)           # many ties
    x.reshape(-1)[rng.choice(x.size, 5, replace=False)] = [np.nan, np.inf, -np.inf, -0.0, 0.0]
    gy = rng.standard_normal((n, c, oh, ow)).astype(np.float32)
    gy.reshape(-1)[:2] = [-0.0, np.nan]
    x, gy = x.astype(dtype), gy.astype(dtype)
    results = {}
    for runs in (True, False):
        monkeypatch.setattr(cuda_pool, "RUN3_POOLS", runs)
        y = to_device(np.full((n, c, oh, ow), 5, dtype), "nhwc")
        arg = to_device(np.full((n, c, oh, ow), 77, np.uint8), "nhwc")
        gx = to_device(np.full(shape, 5, dtype), "nhwc")
        cuda_pool.maxpool2d_forward(to_device(x, "nhwc"), y, arg, spec)
        cuda_pool.maxpool2d_backward(to_device(gy, "nhwc"), arg, gx, spec)
        results[runs] = [to_host(a).view(np.uint8) for a in (y, arg, gx)]
    for got, want in zip(results[True], results[False]):
        np.testing.assert_array_equal(got, want)
