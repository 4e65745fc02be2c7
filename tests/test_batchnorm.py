"""BatchNorm2d (layers/batchnorm.py): PyTorch's training and evaluation semantics, float64
gradient checks, recomputation without a second update of the running estimates, state dict
names and checkpoints, and the GPU kernels against the NumPy ones."""
import numpy as np
import pytest

from minidnn import Executor, Network, SGD
from minidnn.checkpoint import load_checkpoint, restore, save_checkpoint
from minidnn.errors import ConfigError, ShapeError
from minidnn.gradcheck import check_backward
from minidnn.kernels import cpu as cpu_kernels
from minidnn.kernels import cpu_batchnorm
from minidnn.layers import BatchNorm2d, Conv2d, Flatten, Linear, ReLU, StepContext


def make_layer(shape, dtype=np.float64, seed=0):
    layer = BatchNorm2d()
    layer.setup([shape], dtype)
    rng = np.random.default_rng(seed)
    layer.params["weight"].data = (1 + 0.1 * rng.standard_normal(shape[1])).astype(dtype)
    layer.params["bias"].data = (0.1 * rng.standard_normal(shape[1])).astype(dtype)
    for b in layer.buffers.values():
        b.data = b.initial_value(dtype)
    return layer


def run(layer, x, train=True, aux=True):
    y = np.empty_like(x)
    aux = {k: np.empty(s, d) for k, (s, d) in layer.aux_specs().items()} if aux else None
    layer.forward([x], y, aux, StepContext(np, kernels=cpu_kernels, train=train))
    return y, aux


@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (2, 5, 3, 4), (8, 2, 1, 1)])
def test_gradients(shape):
    check_backward(BatchNorm2d(), [shape])


def test_training_normalizes_with_the_batch_and_moves_the_running_estimates():
    shape = (6, 3, 4, 5)
    rng = np.random.default_rng(1)
    layer = make_layer(shape)
    w, b = layer.params["weight"].data, layer.params["bias"].data
    running_mean, running_var = np.zeros(3), np.ones(3)
    for step in range(3):
        x = 2.0 + 3.0 * rng.standard_normal(shape)
        y, aux = run(layer, x)
        mean = x.mean(axis=(0, 2, 3))
        var = x.var(axis=(0, 2, 3))
        expect = (x - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5) \
            * w[:, None, None] + b[:, None, None]
        np.testing.assert_allclose(y, expect, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(aux["mean"], mean, rtol=1e-12)
        np.testing.assert_allclose(aux["invstd"], 1 / np.sqrt(var + 1e-5), rtol=1e-12)
        running_mean = 0.9 * running_mean + 0.1 * mean
        running_var = 0.9 * running_var + 0.1 * x.var(axis=(0, 2, 3), ddof=1)
        np.testing.assert_allclose(layer.buffers["running_mean"].data, running_mean, rtol=1e-12)
        np.testing.assert_allclose(layer.buffers["running_var"].data, running_var, rtol=1e-12)
        assert int(layer.buffers["num_batches_tracked"].data) == step + 1
    # Evaluation: the running estimates, nothing updated.
    x = rng.standard_normal(shape)
    y, _ = run(layer, x, train=False)
    expect = (x - running_mean[:, None, None]) / np.sqrt(running_var[:, None, None] + 1e-5) \
        * w[:, None, None] + b[:, None, None]
    np.testing.assert_allclose(y, expect, rtol=1e-12, atol=1e-12)
    assert int(layer.buffers["num_batches_tracked"].data) == 3


def test_recomputation_gives_the_same_bits_and_updates_nothing():
    shape = (4, 3, 6, 6)
    layer = make_layer(shape, np.float32)
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    y, _ = run(layer, x)
    before = {k: b.data.copy() for k, b in layer.buffers.items()}
    again, _ = run(layer, x, aux=False)
    assert np.array_equal(again, y)
    for k, b in layer.buffers.items():
        assert np.array_equal(b.data, before[k]), k


def test_declares_what_backward_keeps_and_whole_batch_statistics():
    layer = BatchNorm2d()
    layer.setup([(2, 4, 3, 3)])
    assert layer.retain_inputs == (0,) and not layer.retain_output
    assert {k: s for k, (s, _) in layer.aux_specs().items()} == {"mean": (4,), "invstd": (4,)}
    assert layer.recomputable and layer.batch_statistics
    assert not Conv2d(2, 3).batch_statistics


def test_float32_statistics_of_a_large_offset_keep_their_digits():
    x = (1000.0 + np.random.default_rng(3).standard_normal((64, 2, 16, 16))).astype(np.float32)
    mean, var = np.empty(2, np.float32), np.empty(2, np.float32)
    cpu_batchnorm.batchnorm_stats(x, mean, var)
    ref = x.astype(np.float64)
    np.testing.assert_allclose(var, ref.var(axis=(0, 2, 3)), rtol=1e-4)


def test_errors():
    with pytest.raises(ShapeError, match="N, C, H, W"):
        BatchNorm2d(name="bn").setup([(2, 5)])
    with pytest.raises(ConfigError, match="momentum"):
        BatchNorm2d(momentum=2)
    with pytest.raises(ConfigError, match="eps"):
        BatchNorm2d(eps=0)
    layer = make_layer((1, 3, 1, 1))
    with pytest.raises(ShapeError, match="more than one value per channel"):
        run(layer, np.ones((1, 3, 1, 1)))


def bn_net():
    net = Network((3, 8, 8), num_classes=4, name="bn_net")
    net.add(Conv2d(6, 3, padding=1, bias=False), name="conv1")
    net.add(BatchNorm2d(), name="bn1")
    net.add(ReLU(), name="relu1")
    net.add(Flatten(), name="flatten")
    net.add(Linear(4), name="fc")
    net.add_loss()
    net.infer_shapes(1)
    return net


def test_state_dict_names_order_and_layouts_are_pytorchs():
    net = bn_net()
    net.init_params(0)
    state = net.state_dict()
    assert list(state) == ["conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean",
                           "bn1.running_var", "bn1.num_batches_tracked", "fc.weight", "fc.bias"]
    assert state["bn1.running_var"].shape == (6,) and np.all(state["bn1.running_var"] == 1)
    assert state["bn1.num_batches_tracked"].shape == () and \
        state["bn1.num_batches_tracked"].dtype == np.int64
    # Buffers are not parameters: the optimizer never sees them.
    assert [n for n, _ in net.parameters()] == ["conv1.weight", "bn1.weight", "bn1.bias",
                                                "fc.weight", "fc.bias"]


def test_training_moves_the_running_statistics_and_checkpoints_carry_them(tmp_path):
    net = bn_net()
    rng = np.random.default_rng(0)
    with Executor(net, 4, device="cpu", seed=0) as ex:
        opt = SGD(ex.parameters(), lr=0.05, momentum=0.9, allocator=ex.allocator)
        for _ in range(2):
            ex.train_step(rng.standard_normal((4, 3, 8, 8)).astype(np.float32),
                          rng.integers(0, 4, 4), opt)
    state = net.state_dict()
    assert int(state["bn1.num_batches_tracked"]) == 2
    assert not np.allclose(state["bn1.running_mean"], 0)
    path = tmp_path / "bn.npz"
    save_checkpoint(str(path), net, step=2)
    other = bn_net()
    other.init_params(1)
    restore(load_checkpoint(str(path)), other)
    for key, value in other.state_dict().items():
        assert np.array_equal(value, state[key]), key
    assert other.param_checksum() == net.param_checksum()
    # Evaluation reads the running statistics (they are on the executor's device).
    x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
    with Executor(other, 4, device="cpu", seed=0) as ex:
        loss, _ = ex.evaluate(x, rng.integers(0, 4, 4))
    assert np.isfinite(loss)
    assert int(other.state_dict()["bn1.num_batches_tracked"]) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
# 1 and 3 parts a channel (NCHW); channel counts off and on the 4-value vectors and 32-channel
# blocks of the channels-last kernels
@pytest.mark.parametrize("shape", [(16, 5, 13, 11), (40, 5, 37, 29), (8, 64, 7, 9),
                                   (4, 130, 5, 3)])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_gpu_kernels_match_the_numpy_ones(dtype, shape, layout):
    import cupy as cp
    from minidnn.kernels import cuda_batchnorm as gpu

    def device(a):
        """a on the GPU, in the layout under test (NHWC: logically NCHW, channels last)."""
        a = cp.asarray(a)
        return a if layout == "nchw" else a.transpose(0, 2, 3, 1).copy().transpose(0, 3, 1, 2)

    rng = np.random.default_rng(4)
    x = (3 + 2 * rng.standard_normal(shape)).astype(dtype)
    gy = rng.standard_normal(shape).astype(dtype)
    c = shape[1]
    w = (1 + 0.1 * rng.standard_normal(c)).astype(dtype)
    b = rng.standard_normal(c).astype(dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-11, atol=1e-11)

    m, v = np.empty(c, dtype), np.empty(c, dtype)
    cpu_batchnorm.batchnorm_stats(x, m, v)
    gm, gv = cp.empty(c, dtype), cp.empty(c, dtype)
    gpu.batchnorm_stats(device(x), gm, gv)
    np.testing.assert_allclose(gm.get(), m, **tol)
    np.testing.assert_allclose(gv.get(), v, **tol)
    invstd = (1 / np.sqrt(v + 1e-5)).astype(dtype)
    y = np.empty_like(x)
    cpu_batchnorm.batchnorm_forward(x, m, invstd, w, b, y)
    gy_dev = device(np.empty(shape, dtype))
    gpu.batchnorm_forward(device(x), cp.asarray(m), cp.asarray(invstd), cp.asarray(w),
                          cp.asarray(b), gy_dev)
    np.testing.assert_allclose(gy_dev.get(), y, **tol)
    gx, gw, gb = np.empty_like(x), np.empty(c, dtype), np.empty(c, dtype)
    cpu_batchnorm.batchnorm_backward(x, gy, m, invstd, w, gx, gw, gb)
    dgx, dgw, dgb = device(np.empty(shape, dtype)), cp.empty(c, dtype), cp.empty(c, dtype)
    gpu.batchnorm_backward(device(x), device(gy), cp.asarray(m), cp.asarray(invstd),
                           cp.asarray(w), dgx, dgw, dgb)
    np.testing.assert_allclose(dgx.get(), gx, **tol)
    np.testing.assert_allclose(dgw.get(), gw, rtol=tol["rtol"], atol=1e-3 if dtype == np.float32
                               else 1e-9)
    np.testing.assert_allclose(dgb.get(), gb, rtol=tol["rtol"], atol=1e-3 if dtype == np.float32
                               else 1e-9)
    # The statistics reduce in a fixed order: the same bits again.
    gm2, gv2 = cp.empty(c, dtype), cp.empty(c, dtype)
    gpu.batchnorm_stats(device(x), gm2, gv2)
    assert cp.array_equal(gm2, gm) and cp.array_equal(gv2, gv)
    # A training step's forward: statistics, y and the running estimates in one call.
    rm, rv = rng.standard_normal(c).astype(dtype), (1 + rng.random(c)).astype(dtype)
    y2, m2, inv2 = np.empty_like(x), np.empty(c, dtype), np.empty(c, dtype)
    crm, crv = rm.copy(), rv.copy()
    cpu_batchnorm.batchnorm_training_forward(x, w, b, y2, m2, inv2, 1e-5, (crm, crv, 0.1))
    dy2, dm2, dinv2 = device(np.empty(shape, dtype)), cp.empty(c, dtype), cp.empty(c, dtype)
    drm, drv = cp.asarray(rm), cp.asarray(rv)
    gpu.batchnorm_training_forward(device(x), cp.asarray(w), cp.asarray(b), dy2, dm2, dinv2,
                                   1e-5, (drm, drv, 0.1))
    for got, want in ((dy2, y2), (dm2, m2), (dinv2, inv2), (drm, crm), (drv, crv)):
        np.testing.assert_allclose(got.get(), want, **tol)
    moved = drm.copy(), drv.copy()
    again = device(np.empty(shape, dtype))
    gpu.batchnorm_training_forward(device(x), cp.asarray(w), cp.asarray(b), again, dm2, dinv2,
                                   1e-5, None)   # a recomputation: the same bits, no update
    assert cp.array_equal(again, dy2)
    assert cp.array_equal(drm, moved[0]) and cp.array_equal(drv, moved[1])
    # With the ReLU after it (minidnn/fusion.py): the bits of the ReLU's own kernel after it.
    from minidnn.kernels import cuda_pointwise
    fused = device(np.full(shape, np.nan, dtype))
    gpu.batchnorm_training_forward(device(x), cp.asarray(w), cp.asarray(b), fused, dm2, dinv2,
                                   1e-5, None, relu=True)
    cuda_pointwise.relu_forward(again, again)
    assert cp.array_equal(fused, again) and bool((fused >= 0).all())
    evaluated = device(np.full(shape, np.nan, dtype))
    gpu.batchnorm_forward(device(x), cp.asarray(m), cp.asarray(invstd), cp.asarray(w),
                          cp.asarray(b), evaluated, relu=True)
    cuda_pointwise.relu_forward(gy_dev, gy_dev)
    assert cp.array_equal(evaluated, gy_dev)


def test_channels_last_maps_give_the_numbers_of_nchw_ones():
    shape = (4, 3, 5, 6)
    rng = np.random.default_rng(5)
    x, gy = rng.standard_normal(shape), rng.standard_normal(shape)

    def nhwc(a):
        return np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)

    results = []
    for lay in (lambda a: a, nhwc):
        layer = make_layer(shape)
        y, aux = lay(np.empty(shape)), {k: np.empty(s, d)
                                       for k, (s, d) in layer.aux_specs().items()}
        ctx = StepContext(np, kernels=cpu_kernels, train=True)
        layer.forward([lay(x)], y, aux, ctx)
        gx = lay(np.empty(shape))
        for p in layer.params.values():
            p.grad = np.empty(p.shape)
        layer.backward([lay(x)], None, lay(gy), [gx], aux, ctx)
        results.append([y, gx, layer.params["weight"].grad, layer.buffers["running_var"].data])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
