"""The GPU batch-norm kernels (kernels/cuda_batchnorm.py) with 16-byte vector reads and the
ReLU after a batch norm folded into them (minidnn/fusion.py): against the NumPy reference on
awkward sizes, in both layouts and in float32 and bf16; the same bits on every call; the
folded backward gives the bits of the ReLU's backward followed by the batch norm's; and a
fused training step the bits of the unfused one."""
import numpy as np
import pytest

from minidnn.kernels import cpu_batchnorm, mapformat
from test_bf16_gpu import BF16, gpu, to_device  # noqa: F401, F811  (gpu: the fixture)

pytestmark = pytest.mark.gpu

# Shapes: C a multiple of 8 (vector groups) and not (5, 12, 130), tiny N * H * W, one
# channel, planes whose H * W is a multiple of 8 (NCHW vectors) and not.
SHAPES = [(4, 64, 6, 5), (16, 5, 13, 11), (3, 12, 4, 4), (2, 130, 1, 1), (1, 8, 1, 2),
          (8, 1, 7, 9), (40, 24, 8, 8)]
EPS = 1e-5


def raw(cp, a):
    """The bytes of GPU array `a` in logical (NCHW) order: what bit comparisons compare."""
    host = cp.asnumpy(mapformat.in_memory_order(a).view(np.uint8)).view(a.dtype)
    if a.ndim == 4 and not a.flags.c_contiguous:
        n, c, h, w = a.shape
        host = host.reshape(n, h, w, c).transpose(0, 3, 1, 2)
    return np.ascontiguousarray(host.reshape(a.shape))


def inputs(shape, dtype, seed=4):
    """x (offset and scaled per channel), gy, weight, bias; maps in `dtype`, per-channel
    arrays float32 (beside bf16 maps) or float64."""
    rng = np.random.default_rng(seed)
    c = shape[1]
    x = 3 + 2 * rng.standard_normal(shape) * (1 + np.arange(c)).reshape(1, c, 1, 1) ** 0.5
    gy = rng.standard_normal(shape)
    w = 1 + 0.3 * rng.standard_normal(c)
    b = 0.5 * rng.standard_normal(c)
    channel = np.float32 if dtype in (np.float32, BF16) else np.float64
    return x.astype(dtype), gy.astype(dtype), w.astype(channel), b.astype(channel)


def run_gpu(cp, gpu_bn, layout, x, gy, w, b, relu):
    """One training forward and backward on the GPU: {name: host array} (maps raw)."""
    c = x.shape[1]
    dt = w.dtype
    dx, dgy = to_device(cp, x, layout), to_device(cp, gy, layout)
    dy, dgx = to_device(cp, np.zeros_like(x), layout), to_device(cp, np.zeros_like(x), layout)
    mean, invstd = cp.empty(c, dt), cp.empty(c, dt)
    rm, rv = cp.zeros(c, dt), cp.ones(c, dt)
    dw, db = cp.asarray(w), cp.asarray(b)
    gw, gb = cp.empty(c, dt), cp.empty(c, dt)
    gpu_bn.batchnorm_training_forward(dx, dw, db, dy, mean, invstd, EPS, (rm, rv, 0.1), relu)
    gpu_bn.batchnorm_backward(dx, dgy, mean, invstd, dw, dgx, gw, gb,
                              (db, None) if relu else None)
    return {"y": raw(cp, dy), "gx": raw(cp, dgx), "mean": mean.get(), "invstd": invstd.get(),
            "running_mean": rm.get(), "running_var": rv.get(), "gweight": gw.get(),
            "gbias": gb.get()}


def run_numpy(x, gy, w, b, relu, passed=None):
    """The reference, in float64 on the maps' values (bf16 ones widened). passed: where the
    ReLU passes its gradient, given (the GPU's output > 0) so that outputs within rounding
    of 0 do not flip it; the folded mask itself is checked bit for bit below."""
    x64, gy64 = x.astype(np.float64), gy.astype(np.float64)
    if passed is not None:
        gy64 = gy64 * passed
    c = x.shape[1]
    y, mean, invstd = np.empty_like(x64), np.empty(c), np.empty(c)
    rm, rv = np.zeros(c), np.ones(c)
    w64, b64 = w.astype(np.float64), b.astype(np.float64)
    cpu_batchnorm.batchnorm_training_forward(x64, w64, b64, y, mean, invstd, EPS,
                                             (rm, rv, 0.1), relu)
    gx, gw, gb = np.empty_like(x64), np.empty(c), np.empty(c)
    cpu_batchnorm.batchnorm_backward(x64, gy64, mean, invstd, w64, gx, gw, gb)
    return {"y": y, "gx": gx, "mean": mean, "invstd": invstd, "running_mean": rm,
            "running_var": rv, "gweight": gw, "gbias": gb}


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("relu", [False, True])
def test_kernels_match_numpy_and_repeat_their_bits(gpu, shape, layout, dtype, relu):
    cp = gpu[0]
    from minidnn.kernels import cuda_batchnorm as gpu_bn
    x, gy, w, b = inputs(shape, dtype)
    got = run_gpu(cp, gpu_bn, layout, x, gy, w, b, relu)
    want = run_numpy(x, gy, w, b, relu, got["y"].astype(np.float32) > 0 if relu else None)
    # Relative to each result's largest value: float32 sums of ~1e4 values, or one bf16
    # rounding of every output (8 significant bits) and of the gradients' terms.
    tol = 2e-5 if dtype == np.float32 else 2e-2
    # gx = gy * a + (x - mean) * b + d cancels to about 0 when a channel has two values (the
    # normalised values are then +-1 whatever x is): its error is relative to its terms.
    terms = float(np.abs(gy.astype(np.float64)).max() * np.abs(w.astype(np.float64) *
                                                                want["invstd"]).max())
    for key, ref in want.items():
        value = got[key].astype(np.float64)
        assert np.all(np.isfinite(value)), key
        scale = max(float(np.abs(ref).max()), terms if key == "gx" else 0.0, 1e-6)
        err = float(np.abs(value - ref).max())
        assert err <= tol * scale, f"{key}: max error {err:.3g} of max {scale:.3g}"
    if relu:
        assert (got["y"].astype(np.float32) >= 0).all()
    again = run_gpu(cp, gpu_bn, layout, x, gy, w, b, relu)   # a fixed order: the same bits
    for key in got:
        assert got[key].tobytes() == again[key].tobytes(), key


@pytest.mark.parametrize("shape", [(64, 16, 16, 16), (32, 24, 7, 7), (80, 5, 16, 16)],
                         ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["fp32", "bf16"])
def test_statistics_keep_the_variance_of_a_channel_whose_mean_dwarfs_its_spread(
        gpu, shape, layout, dtype):
    """The forward sums run in float32 in short runs from a shift, the channel's first value
    (kernels/cuda_batchnorm.py): a mean 10^4 times the standard deviation (float32; bf16,
    whose steps are 2 at 300: a mean 100 times a spread of 3) leaves the variance exact to
    float32's precision, where float32 sums of x^2 would lose it whole. Shapes: groups of 8
    in both layouts; NCHW planes of 49 values and channels last with C = 24; C = 5 (one
    channel a group channels last) with 20480 values a channel, two parts in NCHW, each
    shifted by the same first value."""
    cp = gpu[0]
    from minidnn.kernels import cuda_batchnorm as gpu_bn
    rng = np.random.default_rng(11)
    mean, spread = (1e4, 1.0) if dtype == np.float32 else (300.0, 3.0)
    x = (mean + spread * rng.standard_normal(shape)).astype(dtype)
    x64 = x.astype(np.float64)
    want_mean, want_var = x64.mean(axis=(0, 2, 3)), x64.var(axis=(0, 2, 3))
    c = shape[1]
    got_mean, got_var = cp.empty(c, cp.float32), cp.empty(c, cp.float32)
    gpu_bn.batchnorm_stats(to_device(cp, x, layout), got_mean, got_var)
    assert np.abs(got_mean.get() - want_mean).max() <= 2e-7 * mean
    assert np.abs(got_var.get() / want_var - 1).max() <= 1e-5


@pytest.mark.parametrize("shape", [(4, 64, 6, 5), (16, 5, 13, 11), (8, 1, 7, 9)], ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["fp32", "bf16"])
def test_the_folded_backward_gives_the_bits_of_the_relus_then_the_batch_norms(
        gpu, shape, layout, dtype):
    """The mask the batch norm recomputes from x is the ReLU's on the stored output: the
    fused call, relu_mask then the plain call, and cuda_pointwise.relu_backward on the
    forward's output then the plain call all give the same bits."""
    cp = gpu[0]
    from minidnn.kernels import cuda_batchnorm as gpu_bn
    from minidnn.kernels import cuda_pointwise
    x, gy, w, b = inputs(shape, dtype, seed=9)
    c, dt = shape[1], w.dtype
    dx, dw, db = to_device(cp, x, layout), cp.asarray(w), cp.asarray(b)
    y = to_device(cp, np.zeros_like(x), layout)
    mean, invstd = cp.empty(c, dt), cp.empty(c, dt)
    gpu_bn.batchnorm_training_forward(dx, dw, db, y, mean, invstd, EPS, None, relu=True)
    results = []
    for way in ("fused", "relu_mask", "relu_backward"):
        g = to_device(cp, gy, layout)
        gx = to_device(cp, np.zeros_like(x), layout)
        gw, gb = cp.empty(c, dt), cp.empty(c, dt)
        if way == "fused":
            gpu_bn.batchnorm_backward(dx, g, mean, invstd, dw, gx, gw, gb, (db, None))
        else:
            if way == "relu_mask":
                gpu_bn.relu_mask(dx, g, mean, invstd, dw, db)
            else:
                cuda_pointwise.relu_backward(y, g, g)
            gpu_bn.batchnorm_backward(dx, g, mean, invstd, dw, gx, gw, gb)
        results.append((raw(cp, gx).tobytes(), gw.get().tobytes(), gb.get().tobytes()))
    assert results[0] == results[1] == results[2]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("training", [True, False], ids=["training", "eval"])
def test_the_folded_add_gives_the_bits_of_the_batch_norm_then_add_relu(gpu, shape, layout,
                                                                        dtype, training):
    """A batch norm that applies the residual add after it and its ReLU (minidnn/fusion.py)
    writes the bits of its plain pass followed by cuda_pointwise.add_relu; with the
    statistics of the batch (training) and with given ones (evaluation)."""
    cp = gpu[0]
    from minidnn.kernels import cuda_batchnorm as gpu_bn
    from minidnn.kernels import cuda_pointwise
    x, z, w, b = inputs(shape, dtype, seed=11)
    c, dt = shape[1], w.dtype
    dx, dz, dw, db = to_device(cp, x, layout), to_device(cp, z, layout), cp.asarray(w), \
        cp.asarray(b)
    outputs = []
    for fused in (True, False):
        y = to_device(cp, np.zeros_like(x), layout)
        mean, invstd = cp.zeros(c, dt), cp.ones(c, dt)
        residual = (dz, None) if fused else None
        if training:
            gpu_bn.batchnorm_training_forward(dx, dw, db, y, mean, invstd, EPS, None,
                                              residual=residual)
        else:
            mean, invstd = cp.asarray(0.1 * w), cp.asarray(1 + 0.2 * np.abs(b))
            gpu_bn.batchnorm_forward(dx, mean, invstd, dw, db, y, residual=residual)
        if not fused:
            cuda_pointwise.add_relu(y, dz, y)
        outputs.append(raw(cp, y).tobytes())
    assert outputs[0] == outputs[1]
    assert (raw(cp, y).astype(np.float32) >= 0).all()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_a_fused_gpu_step_gives_the_bits_of_the_unfused_one(gpu, precision, layout):
    """A stem and a residual block (tests/test_fused_bn_relu.py's network) trained two
    steps on the GPU with deterministic algorithms, fused and not: the same bits."""
    from test_fused_bn_relu import small_resnet
    from minidnn import SGD
    from minidnn.decide import build_executor

    def train(fuse):
        net = small_resnet()
        net.init_params(0)
        with build_executor(net, 4, device="gpu", seed=1, fuse=fuse, precision=precision,
                            layout=layout, deterministic=True) as ex:
            opt = SGD(ex.parameters(), lr=0.1, momentum=0.9)
            rng = np.random.default_rng(2)
            losses = []
            for _ in range(2):
                x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
                losses.append(float(ex.train_step(x, rng.integers(0, 10, 4), opt)))
            pairs = dict(ex.decision.bn_relu), dict(ex.decision.bn_add)
        return losses, {k: np.array(v) for k, v in net.state_dict().items()}, pairs

    losses, state, pairs = train(True)
    assert pairs == ({"relu1": "bn1", "relu2": "bn2"}, {"sum": "bn3"})
    plain_losses, plain_state, none = train(False)
    assert none == ({}, {}) and losses == plain_losses
    for k in state:
        assert state[k].tobytes() == plain_state[k].tobytes(), k


def offset_by_one(cp, a, layout):
    """`a` on the GPU in `layout`, starting one value past a 16-byte boundary."""
    host = mapformat.arrange(a, layout).reshape(-1).view(np.uint8)
    size = a.dtype.itemsize
    flat = cp.zeros(host.size + size, np.uint8)
    flat[size:] = cp.asarray(host)
    return mapformat.shaped(flat[size:], a.shape, a.dtype, layout)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("addend", [True, False], ids=["sum", "one"])
def test_handed_sums_give_the_bits_of_the_add_then_the_batch_norm(gpu, shape, layout, dtype,
                                                                   addend):
    """handed_sums (minidnn/fusion.py, bn_sums) writes the add's gradient as
    cuda_pointwise.relu_mask_sum (relu_backward without a second part) writes it, and the
    batch norm's backward from its sums gives the bits of the plain backward of that
    gradient; in place into gy, and with the add's maps aligned apart (its own pass, then
    the sums) too."""
    cp = gpu[0]
    from minidnn.kernels import cuda_batchnorm as gpu_bn
    from minidnn.kernels import cuda_pointwise
    x, gy, w, b = inputs(shape, dtype, seed=13)
    y, g2, _, _ = inputs(shape, dtype, seed=14)
    y = (y.astype(np.float32) - 3).astype(dtype)               # about half the mask is off
    c, dt = shape[1], w.dtype
    dx, dw, db = to_device(cp, x, layout), cp.asarray(w), cp.asarray(b)
    mean, invstd = cp.empty(c, dt), cp.empty(c, dt)
    gpu_bn.batchnorm_training_forward(dx, dw, db, to_device(cp, np.zeros_like(x), layout),
                                      mean, invstd, EPS, None)
    results = []
    for way in ("plain", "handed", "in place", "apart"):
        place = offset_by_one if way == "apart" else to_device
        dy, dgy = place(cp, y, layout), to_device(cp, gy, layout)
        dg2 = to_device(cp, g2, layout) if addend else None
        # in place: into gy's buffer (a projection block's add, whose batch norm writes its
        # input 1 and reads input 0's gradient, which shares gy's)
        g = dgy if way == "in place" else to_device(cp, np.zeros_like(x), layout)
        gx = to_device(cp, np.zeros_like(x), layout)
        gw, gb = cp.empty(c, dt), cp.empty(c, dt)
        if way == "plain":
            if addend:
                cuda_pointwise.relu_mask_sum(dy, dgy, dg2, g)
            else:
                cuda_pointwise.relu_backward(dy, dgy, g)
            gpu_bn.batchnorm_backward(dx, g, mean, invstd, dw, gx, gw, gb)
        else:
            sums = gpu_bn.handed_sums(dy, dgy, dg2, g, dx, mean)
            gpu_bn.batchnorm_backward(dx, g, mean, invstd, dw, gx, gw, gb, sums=sums)
        results.append((raw(cp, g).tobytes(), raw(cp, gx).tobytes(), gw.get().tobytes(),
                        gb.get().tobytes()))
    assert results[0] == results[1] == results[2] == results[3]
    want = np.where(y.astype(np.float32) > 0, (gy.astype(np.float32) + g2.astype(np.float32)
                                                ).astype(dtype) if addend else gy,
                    np.zeros((), dtype))
    assert results[0][0] == want.tobytes()
