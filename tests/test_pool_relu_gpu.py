"""A max pool that applies the mask of the ReLU before it (minidnn/fusion.py, pool_relu), on
the GPU: every max-pool kernel path marked and masked, bit for bit against the unmarked pool
and the ReLU's own backward; every forward path applying the ReLU itself (pool_relu_forward)
against the ReLU's pass and the pool; a training step against the unfused one. Skipped
without a CUDA GPU."""
import numpy as np
import pytest

from minidnn.kernels import RELU_MASK_BIT, PoolSpec

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")
cuda_pool = pytest.importorskip("minidnn.kernels.cuda_pool")
from minidnn.kernels import cuda_pointwise as pw  # noqa: E402
from test_pointwise_gpu import BF16, bf16_maps, host_bits, to_device  # noqa: E402
from test_pool_gpu import out_shape, same_bits  # noqa: E402
from test_runs_gpu import gpu  # noqa: E402, F401, F811  (the fixture)

# (kernel, stride, padding, ceil_mode, image size): VGG's 2x2 tiles (channels last: the
# `tiles` kernels), ResNet's padded 3x3/2, AlexNet's 3x3/2 with ceil_mode, GoogLeNet's 3x3/1
# (channels-last float32 in vectors: the `run3` kernels).
GEOMETRIES = {"2x2/2": (2, 2, 0, False, 8), "3x3/2 p1": (3, 2, 1, False, 9),
              "3x3/2 ceil": (3, 2, 0, True, 10), "3x3/1 p1": (3, 1, 1, False, 7)}


def _device_map(shape, dtype, layout, seed, special):
    """A map on the device: bf16_maps' values for bf16, else normal values into which
    special(rng, flat) writes the values a test wants."""
    if dtype == BF16:
        return to_device(bf16_maps(shape, seed), layout)
    rng = np.random.default_rng(seed)
    v = rng.standard_normal(shape).astype(dtype)
    special(rng, v.reshape(-1))
    return to_device(v, layout)


def _ties_zeros_nan(rng, flat):
    flat[::2] = rng.integers(-3, 4, flat[::2].size)            # ties and zeros
    flat[1::9], flat[::23] = -0.0, np.nan


def _relu_input(shape, dtype, layout, seed):
    """A ReLU's input on the device: both signs, ties, zeros of both signs, NaN."""
    return _device_map(shape, dtype, layout, seed, _ties_zeros_nan)


def _relu_output(shape, dtype, layout, seed):
    """A ReLU's output on the device: ties, zeros, of _relu_input's values."""
    x = _relu_input(shape, dtype, layout, seed)
    pw.relu_forward(x, x)
    return x


def _positive(y):
    """y > 0 on the device, a bf16 map widened first."""
    if y.dtype != BF16:
        return y > 0
    wide = cp.empty_like(y, dtype=np.float32)
    pw.bf16_to_float(y, wide)
    return wide > 0


def _signed_zeros_infinities(rng, flat):
    flat[::5], flat[1::7], flat[2::29], flat[3::31] = -0.0, np.inf, np.nan, -np.inf


def _gradient(shape, dtype, layout, seed):
    """An output gradient with zeros of both signs, NaN and infinities."""
    return _device_map(shape, dtype, layout, seed, _signed_zeros_infinities)


@pytest.mark.parametrize("geometry", list(GEOMETRIES))
@pytest.mark.parametrize("channels", [3, 64])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float64], ids=str)
def test_a_pool_with_the_relu_mask_gives_the_bits_of_the_pool_then_the_relu(
        gpu, geometry, channels, layout, dtype):
    """Forward: the unmarked maxima and offsets, bit 7 where the maximum is > 0. Backward:
    relu_backward of the unmarked backward, bit for bit."""
    k, s, p, ceil, size = GEOMETRIES[geometry]
    spec = PoolSpec(kernel=(k, k), stride=(s, s), padding=(p, p), ceil_mode=ceil)
    shape = (3, channels, size, size)
    x = _relu_output(shape, dtype, layout, seed=k * 7 + s + channels)
    y_shape = out_shape(shape, spec)
    gy = _gradient(y_shape, dtype, layout, seed=channels + size)
    empty = (lambda s_, d: to_device(np.zeros(s_, d), layout))
    y0, y1 = empty(y_shape, dtype), empty(y_shape, dtype)
    a0, a1 = empty(y_shape, np.uint8), empty(y_shape, np.uint8)
    cuda_pool.maxpool2d_forward(x, y0, a0, spec)
    cuda_pool.maxpool2d_forward(x, y1, a1, spec, relu=True)
    assert same_bits(y1, y0)
    assert cp.array_equal(a1 & (RELU_MASK_BIT - 1), a0)
    assert cp.array_equal(a1 >= RELU_MASK_BIT, _positive(y0))

    want = empty(shape, dtype)
    cuda_pool.maxpool2d_backward(gy, a0, want, spec)
    pw.relu_backward(x, want, want)
    got = to_device(np.full(shape, 7, dtype), layout)
    cuda_pool.maxpool2d_backward(gy, a1, got, spec, relu=True)
    assert same_bits(got, want)              # NaN the same NaN, +0 not -0


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
@pytest.mark.parametrize("channels", [3, 64])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float64], ids=str)
def test_a_pool_applying_the_relu_before_it_gives_the_bits_of_the_relu_then_the_pool(
        gpu, bias, geometry, channels, layout, dtype):
    """maxpool2d_forward on the ReLU's input with rectify=(b, None): the maxima and the
    marked offsets of relu_forward(x, ., b) followed by the pool, bit for bit, through each
    kernel path (per value, vectors of channels, tiles, runs of 3x3/1); x left alone."""
    k, s, p, ceil, size = GEOMETRIES[geometry]
    spec = PoolSpec(kernel=(k, k), stride=(s, s), padding=(p, p), ceil_mode=ceil)
    shape = (3, channels, size, size)
    x = _relu_input(shape, dtype, layout, seed=k * 5 + s + channels + bias)
    before = host_bits(x).view(np.uint8)
    acc = np.float64 if dtype == np.float64 else np.float32
    rng = np.random.default_rng(channels + k)
    b = None
    if bias:
        host = rng.standard_normal(channels).astype(acc)
        host[::4] = rng.integers(-2, 3, host[::4].size)           # sums that tie and cancel
        b = cp.asarray(host)
    relu = cp.empty_like(x)
    pw.relu_forward(x, relu, b)
    y_shape = out_shape(shape, spec)
    empty = (lambda s_, d: to_device(np.zeros(s_, d), layout))
    for marked in (False, True):
        y0, y1 = empty(y_shape, dtype), empty(y_shape, dtype)
        a0, a1 = empty(y_shape, np.uint8), empty(y_shape, np.uint8)
        cuda_pool.maxpool2d_forward(relu, y0, a0, spec, relu=marked)
        cuda_pool.maxpool2d_forward(x, y1, a1, spec, relu=marked, rectify=(b, None))
        assert same_bits(y1, y0)
        assert cp.array_equal(a1, a0)
    assert np.array_equal(host_bits(x).view(np.uint8), before)   # bits: NaN equals NaN


def test_a_pool_refuses_a_relu_it_cannot_apply_as_stored(gpu):
    """The GPU's pool reads the map as stored: a stored dtype other than the map's, or a
    bias of the wrong dtype or length, is refused."""
    spec = PoolSpec(kernel=(2, 2), stride=(2, 2), padding=(0, 0))
    x = to_device(bf16_maps((1, 8, 4, 4), 1))
    y, a = to_device(bf16_maps((1, 8, 2, 2), 2)), cp.zeros((1, 8, 2, 2), np.uint8)
    with pytest.raises(TypeError, match="stored as float32"):
        cuda_pool.maxpool2d_forward(x, y, a, spec, rectify=(None, np.float32))
    for bad in (cp.zeros(8, np.float64), cp.zeros(4, np.float32)):
        with pytest.raises(TypeError, match="bias"):
            cuda_pool.maxpool2d_forward(x, y, a, spec, rectify=(bad, None))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_a_gpu_step_whose_pools_apply_relu_masks_gives_the_bits_of_the_unfused_one(
        gpu, precision, layout):
    """tests/test_fused_pool_relu.py's network (a padded overlapping pool, a 2x2 pool, a
    ReLU with two readers) trained three steps with deterministic algorithms and evaluated,
    fused and with --no-fuse: losses, weights and the evaluation's loss, the same bits."""
    from test_fused_pool_relu import _bits, _one_reader_pools
    from test_fusion import _run
    kwargs = dict(precision=precision, layout=layout, deterministic=True)
    fused = _run(_one_reader_pools(), kwargs, 3, True, 24, "pool_relu_forward", device="gpu")
    # Deterministic: no convolution applies its ReLU, so the pools apply them in forward too.
    assert fused[2] == {"relu1": "pool1", "relu2": "pool2", "relu4": "pool4"}
    plain = _run(_one_reader_pools(), kwargs, 3, False, 24, "pool_relu_forward", device="gpu")
    assert plain[2] == {} and fused[0] == plain[0] and fused[3] == plain[3]
    assert all(_bits(fused[1][k]).tobytes() == _bits(plain[1][k]).tobytes() for k in fused[1])


# ---- the pool's backward summing the bias gradient (pool_bias) --------------------------------
# (geometry, shape): GEOMETRIES's with 64 channels (vectors) and 3 (a channel a thread), one
# pixel a block; then maps of more than SUM_BLOCKS * 8 pixels, whose row lanes step over
# rows and images: wide rows, rows narrower than the 8-pixel step, overlapping windows.
SUMS_CASES = [*((g, (3, c, GEOMETRIES[g][4], GEOMETRIES[g][4])) for g in GEOMETRIES
                for c in (64, 3)),
              ("2x2/2", (4, 16, 64, 72)), ("2x2/2", (512, 8, 6, 6)),
              ("3x3/2 p1", (512, 8, 7, 7)), ("3x3/2 ceil", (2, 64, 100, 100))]


def _misaligned(a):
    """A channels-last copy of device map `a` that starts one value past a 16-byte boundary."""
    n, c, h, w = a.shape
    flat = cp.empty(a.size + 1, dtype=a.dtype)
    out = flat[1:].reshape(n, h, w, c).transpose(0, 3, 1, 2)
    out[...] = a
    return out


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("case", SUMS_CASES, ids=lambda c: f"{c[0]} {c[1]}")
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float64], ids=str)
def test_a_pool_summing_the_bias_gradient_gives_the_bits_of_the_pool_then_bias_grad(
        gpu, dtype, layout, case, relu):
    """maxpool2d_backward(..., gb=gb): gx and gb bit for bit those of maxpool2d_backward
    and then bias_grad of its gx, through the fused pass (channels-last float32 and bf16,
    vectors or not) and the fallbacks (NCHW, float64); float32's sums within 1e-5 of
    float64 ones of the same gradient."""
    geometry, shape = case
    k, s, p, ceil, _ = GEOMETRIES[geometry]
    spec = PoolSpec(kernel=(k, k), stride=(s, s), padding=(p, p), ceil_mode=ceil)
    x = _relu_output(shape, dtype, layout, seed=k + s + shape[1])
    y_shape = out_shape(shape, spec)
    empty = (lambda s_, d: to_device(np.zeros(s_, d), layout))
    y, a = empty(y_shape, dtype), empty(y_shape, np.uint8)
    cuda_pool.maxpool2d_forward(x, y, a, spec, relu=relu)
    gy = _gradient(y_shape, dtype, layout, seed=shape[0] + shape[1])
    acc = np.float64 if dtype == np.float64 else np.float32
    want, want_b = empty(shape, dtype), cp.full(shape[1], 7, acc)
    cuda_pool.maxpool2d_backward(gy, a, want, spec, relu=relu)
    pw.bias_grad(want, want_b)
    got, got_b = to_device(np.full(shape, 7, dtype), layout), cp.full(shape[1], 5, acc)
    cuda_pool.maxpool2d_backward(gy, a, got, spec, relu=relu, gb=got_b)
    assert same_bits(got, want)
    assert same_bits(got_b, want_b)
    if dtype == np.float32:
        gy[~cp.isfinite(gy)] = 0                        # finite sums to compare
        cuda_pool.maxpool2d_backward(gy, a, got, spec, relu=relu, gb=got_b)
        exact = cp.asnumpy(got).astype(np.float64).sum(axis=(0, 2, 3))
        np.testing.assert_allclose(cp.asnumpy(got_b), exact, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("run", cuda_pool.POOL_SUMS_RUNS)
@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("shape", [(4, 16, 64, 72), (512, 8, 6, 6), (3, 3, 8, 8),
                                   (5, 64, 14, 14)], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=str)
def test_both_orders_of_the_rows_give_a_fused_pass_the_bits_of_its_parts(
        gpu, monkeypatch, dtype, shape, strided, run):
    """Blocks taking contiguous shares of the rows or rows strided over the map
    (cuda_pointwise.STRIDED_COLUMNS), the fused pool's threads loading `run` pixels before
    adding them (cuda_pool.POOL_SUMS_RUN; a thread's pixels, rows, not a multiple of it in
    some shapes): the fused pool, and the ReLU's fused backward, have the bits of the pool or
    the ReLU then bias_grad in that order."""
    monkeypatch.setattr(pw, "STRIDED_COLUMNS", strided)
    monkeypatch.setattr(cuda_pool, "POOL_SUMS_RUN", run)
    spec = PoolSpec(kernel=(2, 2), stride=(2, 2), padding=(0, 0))
    x = _relu_output(shape, dtype, "nhwc", seed=int(strided))
    y_shape = out_shape(shape, spec)
    y = to_device(np.zeros(y_shape, dtype), "nhwc")
    a = to_device(np.zeros(y_shape, np.uint8), "nhwc")
    cuda_pool.maxpool2d_forward(x, y, a, spec, relu=True)
    gy = _gradient(y_shape, dtype, "nhwc", seed=shape[0])
    zeros = (lambda: to_device(np.zeros(shape, dtype), "nhwc"))
    want, want_b = zeros(), cp.zeros(shape[1], np.float32)
    cuda_pool.maxpool2d_backward(gy, a, want, spec, relu=True)
    pw.bias_grad(want, want_b)
    got, got_b = zeros(), cp.zeros(shape[1], np.float32)
    cuda_pool.maxpool2d_backward(gy, a, got, spec, relu=True, gb=got_b)
    assert same_bits(got, want) and same_bits(got_b, want_b)
    g = _gradient(shape, dtype, "nhwc", seed=7)
    relu_b, masked = cp.zeros(shape[1], np.float32), zeros()
    pw.relu_backward(x, g, masked, relu_b)
    plain, plain_b = zeros(), cp.zeros(shape[1], np.float32)
    pw.relu_backward(x, g, plain)
    pw.bias_grad(plain, plain_b)
    assert same_bits(masked, plain) and same_bits(relu_b, plain_b)


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=str)
def test_a_pool_summing_the_bias_gradient_takes_maps_apart_from_vector_boundaries(gpu, dtype):
    """Misaligned channels-last maps run the fused pass a channel a thread: the same bits."""
    spec = PoolSpec(kernel=(2, 2), stride=(2, 2), padding=(0, 0))
    shape = (512, 8, 6, 6)
    x = _relu_output(shape, dtype, "nhwc", seed=3)
    y_shape = out_shape(shape, spec)
    y = to_device(np.zeros(y_shape, dtype), "nhwc")
    a = to_device(np.zeros(y_shape, np.uint8), "nhwc")
    cuda_pool.maxpool2d_forward(x, y, a, spec, relu=True)
    gy = _misaligned(_gradient(y_shape, dtype, "nhwc", seed=4))
    want, want_b = to_device(np.zeros(shape, dtype), "nhwc"), cp.zeros(8, np.float32)
    cuda_pool.maxpool2d_backward(gy, a, want, spec, relu=True)
    pw.bias_grad(want, want_b)
    got, got_b = _misaligned(x), cp.zeros(8, np.float32)
    cuda_pool.maxpool2d_backward(gy, a, got, spec, relu=True, gb=got_b)
    assert got.data.ptr % 16 and same_bits(got, want) and same_bits(got_b, want_b)
    with pytest.raises(TypeError, match="bias gradient"):
        cuda_pool.maxpool2d_backward(gy, a, got, spec, relu=True, gb=cp.zeros(4, np.float32))


@pytest.fixture
def deterministic_plans():
    """cuDNN's deterministic plans for the test's steps (so two runs may agree bit for bit)
    without --deterministic's slices; the mode in force before comes back afterwards."""
    from minidnn.kernels import cuda
    before = cuda.math_mode()
    cuda.configure("tf32", deterministic=True)
    yield
    cuda.configure(**before)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_a_gpu_step_whose_pools_sum_bias_gradients_gives_the_bits_of_one_whose_relus_do(
        gpu, deterministic_plans, monkeypatch, precision, layout):
    """tests/test_fused_pool_relu.py's network trained three steps and evaluated under its
    decision, and under the same decision without pool_bias: the same bits; the pools are
    handed the biases' gradients (the steps after the first are replayed graphs)."""
    from minidnn.kernels import cuda
    from test_fused_pool_relu import (_decided_run, _one_reader_pools, assert_same_runs,
                                      pools_summing_bias)
    calls = pools_summing_bias(monkeypatch, cuda)
    kwargs = dict(precision=precision, layout=layout)
    fused = _decided_run(_one_reader_pools(), kwargs, 3, 24, True, device="gpu")
    assert fused[3] == {"relu1": "pool1", "relu2": "pool2", "relu4": "pool4"} and calls
    apart = _decided_run(_one_reader_pools(), kwargs, 3, 24, False, device="gpu")
    assert_same_runs(fused, apart)
