"""Every layer on the GPU (CuPy arrays, the GPU kernel module) against its NumPy twin.

Skipped where CuPy sees no CUDA device. Tolerances are relative to the largest reference value:
1e-3 for convolutions and matrix products (they may run in TF32), 1e-5 for everything else.
Dropout draws its mask on the device, so the twin is computed from that same mask.
Each comparison runs again with channels-last (NHWC) feature maps and conv weights on the
GPU (kernels/mapformat.py): same values, other strides.
"""
import numpy as np
import pytest

from minidnn import kernels
from minidnn.backend import Device, to_numpy
from minidnn.kernels import cpu as cpu_kernels
from minidnn.kernels import mapformat
from minidnn.layers import (LRN, Add, AvgPool2d, Concat, Conv2d, Dropout, Flatten, Linear,
                            MaxPool2d, ReLU, StepContext)

pytestmark = pytest.mark.gpu

CONV_RTOL, RTOL = 1e-3, 1e-5


@pytest.fixture(scope="module")
def gpu():
    cp = pytest.importorskip("cupy")
    device = Device("gpu")
    return cp, device, kernels.for_device(device)


def assert_close(got, want, rtol, what):
    got, want = to_numpy(got).astype(np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    assert np.all(np.isfinite(got)), f"{what}: not fully written (NaN/inf present)"
    err = float(np.max(np.abs(got - want))) if want.size else 0.0
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    assert err <= rtol * max(scale, 1e-30), \
        f"{what}: max abs error {err:.3g} exceeds {rtol:g} x max |reference| {scale:.3g}"


def laid_out(xp, a, layout="nchw"):
    """A copy of host array `a` with module xp, laid out as `layout` (4-D arrays)."""
    out = mapformat.empty(xp, a.shape, a.dtype, layout)
    out[...] = xp.asarray(a)
    return out


def filled(xp, shape, value, dtype, layout="nchw"):
    out = mapformat.empty(xp, shape, dtype, layout)
    out.fill(value)
    return out


def run_layer(layer, xs, gy, ctx, xp, aux_override=None, layout="nchw"):
    """Forward then backward of `layer` with arrays of module xp; the manager's calling
    convention (None for what the layer did not retain). Returns (y, aux, gxs, param grads).
    layout: of every 4-D buffer made here (outputs, aux, gradients)."""
    y = mapformat.empty(xp, layer.out_shape, np.float32, layout)
    aux = {k: filled(xp, s, 0, d, layout) for k, (s, d) in layer.aux_specs().items()}
    layer.forward(xs, y, aux, ctx)
    if aux_override is not None:   # backward from a given aux (dropout's mask)
        aux = aux_override
    gxs = [filled(xp, x.shape, np.nan, np.float32, layout) for x in xs]
    for p in layer.params.values():
        p.grad = filled(xp, p.shape, np.nan, np.float32, layout)
    layer.backward([x if k in layer.retain_inputs else None for k, x in enumerate(xs)],
                   y if layer.retain_output else None, gy, gxs, aux, ctx)
    return y, aux, gxs, {k: p.grad for k, p in layer.params.items()}


def compare_with_numpy(gpu, layer, in_shapes, rtol, seed=0, layout="nchw"):
    """Run `layer` on NumPy and on the GPU with the same inputs and parameters; compare all.
    layout: of the GPU's 4-D arrays (feature maps, their gradients, conv weights)."""
    cp, device, gpu_kernels = gpu
    rng = np.random.default_rng(seed)
    layer.index = 0
    layer.setup(in_shapes, np.float32)
    params = {k: rng.standard_normal(p.shape).astype(np.float32) * 0.5
              for k, p in layer.params.items()}
    xs = [rng.standard_normal(s).astype(np.float32) for s in in_shapes]
    gy = rng.standard_normal(layer.out_shape).astype(np.float32)

    for k, p in layer.params.items():
        p.data = params[k].copy()
    cpu_ctx = StepContext(np, kernels=cpu_kernels, train=True)
    want = run_layer(layer, [x.copy() for x in xs], gy.copy(), cpu_ctx, np)

    gpu_ctx = StepContext(cp, kernels=gpu_kernels, train=True, device=device)
    with device.compute:
        for k, p in layer.params.items():
            p.data = laid_out(cp, params[k], layout)
        got = run_layer(layer, [laid_out(cp, x, layout) for x in xs],
                        laid_out(cp, gy, layout), gpu_ctx, cp, layout=layout)
    device.synchronize()
    if layout == "nhwc":        # every 4-D result was written where it was, channels last
        for a in [got[0], *got[1].values(), *got[2], *got[3].values()]:
            assert a.ndim != 4 or mapformat.layout_of(a) == "nhwc" or a.flags.c_contiguous

    name = f"{type(layer).__name__}({layer.describe()}) on {in_shapes}, {layout}"
    assert_close(got[0], want[0], rtol, f"{name}: output")
    for a in want[1]:
        expected = want[1][a]
        if isinstance(layer, ReLU) and a == "mask" and layout == "nhwc":
            # The bits follow the values in memory order: channels last.
            bits = np.packbits(mapformat.arrange(want[0] > 0, "nhwc").reshape(-1),
                               bitorder="little")
            expected = np.zeros_like(expected)
            expected[:bits.size] = bits
        if np.issubdtype(expected.dtype, np.integer):
            np.testing.assert_array_equal(to_numpy(got[1][a]), expected, err_msg=f"{name}: {a}")
        else:
            assert_close(got[1][a], want[1][a], rtol, f"{name}: aux {a}")
    for k, (g, w) in enumerate(zip(got[2], want[2])):
        assert_close(g, w, rtol, f"{name}: input {k} gradient")
    for pname in want[3]:
        assert_close(got[3][pname], want[3][pname], rtol, f"{name}: {pname} gradient")


def _random_conv_cases(count, seed):
    """Convolutions with random sizes, strides, padding, dilation and groups."""
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(count):
        groups = int(rng.choice([1, 2, 3]))
        c, o = groups * int(rng.integers(1, 5)), groups * int(rng.integers(1, 5))
        k = int(rng.integers(1, 6))
        stride, dilation = int(rng.integers(1, 4)), int(rng.integers(1, 3))
        pad = int(rng.integers(0, k))
        h, w = (int(v) for v in rng.integers(dilation * (k - 1) + 1, 19, size=2))
        cases.append((dict(out_channels=o, kernel_size=k, stride=stride, padding=pad,
                           dilation=dilation, groups=groups), (int(rng.integers(1, 4)), c, h, w)))
    return cases


CONV_CASES = [
    (dict(out_channels=8, kernel_size=3, padding=1), (2, 4, 9, 9)),
    (dict(out_channels=6, kernel_size=(3, 5), stride=(2, 1), padding=(1, 2)), (3, 3, 11, 8)),
    (dict(out_channels=12, kernel_size=5, padding=2, groups=2), (2, 6, 7, 7)),
    (dict(out_channels=8, kernel_size=3, stride=2, padding=1, groups=8), (2, 8, 13, 13)),  # depthwise
    (dict(out_channels=5, kernel_size=3, dilation=2, padding=2), (2, 3, 10, 9)),
    (dict(out_channels=16, kernel_size=11, stride=4), (2, 3, 35, 35)),                     # AlexNet conv1
    (dict(out_channels=4, kernel_size=1, bias=False), (4, 7, 5, 3)),
] + _random_conv_cases(6, seed=11)


LAYOUTS = ["nchw", "nhwc"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("args, shape", CONV_CASES)
def test_conv(gpu, args, shape, layout):
    compare_with_numpy(gpu, Conv2d(**args), [shape], CONV_RTOL, layout=layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_conv_vgg_sized_channels(gpu, layout):
    """Channel counts the tensor-core NHWC plans are made for; bias gradient over many rows."""
    compare_with_numpy(gpu, Conv2d(64, 3, padding=1), [(4, 32, 20, 20)], CONV_RTOL,
                       layout=layout)


@pytest.mark.parametrize("layer_args, shape", [
    (dict(kernel_size=2), (2, 3, 8, 8)),
    (dict(kernel_size=3, stride=2), (2, 4, 13, 13)),
    (dict(kernel_size=3, stride=2, padding=1), (1, 3, 10, 11)),
    (dict(kernel_size=3, stride=2, ceil_mode=True), (2, 2, 8, 8)),
    (dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 1), ceil_mode=True), (1, 3, 7, 9)),
])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_maxpool(gpu, layer_args, shape, layout):
    compare_with_numpy(gpu, MaxPool2d(**layer_args), [shape], RTOL, layout=layout)


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("layer_args, shape", [
    (dict(kernel_size=2), (2, 3, 8, 8)),
    (dict(kernel_size=3, stride=2, padding=1), (1, 3, 10, 11)),
    (dict(kernel_size=3, stride=2, padding=1, ceil_mode=True), (2, 2, 8, 8)),
    (dict(kernel_size=(2, 3), stride=(3, 2), padding=(1, 1), ceil_mode=True), (1, 2, 9, 7)),
])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_avgpool(gpu, layer_args, shape, count_include_pad, layout):
    compare_with_numpy(gpu, AvgPool2d(**layer_args, count_include_pad=count_include_pad),
                       [shape], RTOL, layout=layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_lrn(gpu, size, layout):
    compare_with_numpy(gpu, LRN(size, alpha=0.5, beta=0.75, k=1.0), [(2, 7, 5, 3)], RTOL,
                       layout=layout)


def test_lrn_alexnet_constants(gpu):
    compare_with_numpy(gpu, LRN(5, alpha=1e-4, beta=0.75, k=1.0), [(2, 16, 6, 6)], RTOL)
    compare_with_numpy(gpu, LRN(5, alpha=0.3, beta=0.6, k=2.0), [(1, 9, 4, 4)], RTOL)


def test_linear(gpu):
    # A matrix product: TF32 too when the kernels' math mode allows it.
    compare_with_numpy(gpu, Linear(7), [(5, 33)], CONV_RTOL)


@pytest.mark.parametrize("layer, shapes", [
    (ReLU(), [(2, 5, 4, 3)]),
    (ReLU(keep="bits"), [(2, 5, 4, 3)]),          # 120 values: the last 32-bit word is partial
    (ReLU(keep="bits"), [(3, 7, 11, 13)]),        # several blocks, a partial last warp
    (Flatten(), [(2, 3, 4, 5)]),
    (Concat(), [(2, 3, 4, 4), (2, 1, 4, 4), (2, 2, 4, 4)]),
    (Concat(axis=-1), [(3, 2, 5), (3, 2, 1)]),
    (Add(), [(2, 3, 5, 5)] * 3),
])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_other_layers(gpu, layer, shapes, layout):
    compare_with_numpy(gpu, layer, shapes, RTOL, layout=layout)


@pytest.mark.parametrize("layer", [Flatten(), ReLU(), ReLU(keep="bits")])
def test_in_place_on_channels_last(gpu, layer):
    """Written over its own channels-last input (the liveness plan's in-place case), the
    output and gradient are those of separate buffers; Flatten's come out in NCHW order."""
    cp, device, gpu_kernels = gpu
    layer.index = 0
    shape = (3, 4, 5, 6)
    layer.setup([shape], np.float32)
    rng = np.random.default_rng(4)
    x = rng.standard_normal(shape).astype(np.float32)
    gy = rng.standard_normal(layer.out_shape).astype(np.float32)
    ctx = StepContext(cp, kernels=gpu_kernels, train=True, device=device)
    with device.compute:
        aux = {k: cp.zeros(s, d) for k, (s, d) in layer.aux_specs().items()}
        sep = run_layer(layer, [laid_out(cp, x, "nhwc")], laid_out(cp, gy, "nhwc"), ctx, cp,
                        layout="nhwc")
        flat = mapformat.empty(cp, shape, np.float32, "nhwc")
        flat[...] = cp.asarray(x)
        mem = mapformat.in_memory_order(flat)
        xa = flat                                       # the input, channels last
        ya = mapformat.shaped(mem.view(cp.uint8), layer.out_shape, np.float32, "nhwc")
        layer.forward([xa], ya, aux, ctx)
        y_now = ya.copy()
        ga = mapformat.shaped(mem.view(cp.uint8), layer.out_shape, np.float32, "nhwc")
        ga[...] = cp.asarray(gy)
        gx = mapformat.shaped(mem.view(cp.uint8), shape, np.float32, "nhwc")
        layer.backward([None], ga if layer.retain_output else None, ga, [gx], aux, ctx)
    device.synchronize()
    np.testing.assert_array_equal(to_numpy(y_now), to_numpy(sep[0]))
    if not layer.retain_output:   # a ReLU keeping its output reads y, which ga overwrote
        np.testing.assert_array_equal(to_numpy(gx), to_numpy(sep[2][0]))


@pytest.mark.parametrize("in_place", [False, True])
def test_dropout_given_the_device_mask(gpu, in_place):
    cp, device, gpu_kernels = gpu
    p = 0.3
    layer = Dropout(p)
    layer.index = 2
    shape = (16, 32, 5, 5)
    layer.setup([shape], np.float32)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32)
    gy = rng.standard_normal(shape).astype(np.float32)
    ctx = StepContext(cp, kernels=gpu_kernels, train=True, step=3, seed=5, device=device)
    with device.compute:
        xd, gyd = cp.array(x), cp.array(gy)   # copies: written in place below
        mask = cp.zeros(shape, dtype=bool)
        y = xd if in_place else cp.empty_like(xd)
        layer.forward([xd], y, {"mask": mask}, ctx)
        gx = gyd if in_place else cp.empty_like(gyd)
        layer.backward([None], None, gyd, [gx], {"mask": mask}, ctx)
    device.synchronize()
    m = to_numpy(mask)
    assert abs(m.mean() - (1 - p)) < 0.03
    scale = np.float32(1 / (1 - p))
    assert_close(y, x * m * scale, RTOL, "dropout output")
    assert_close(gx, gy * m * scale, RTOL, "dropout input gradient")
    # The same (seed, step, layer) draws the same mask again.
    with device.compute:
        again = cp.zeros(shape, dtype=bool)
        layer.forward([cp.asarray(x)], cp.empty_like(xd), {"mask": again}, ctx)
    device.synchronize()
    np.testing.assert_array_equal(to_numpy(again), m)


def test_dropout_eval_is_identity(gpu):
    cp, device, gpu_kernels = gpu
    layer = Dropout(0.5)
    layer.index = 0
    layer.setup([(4, 6)], np.float32)
    x = cp.arange(24, dtype=cp.float32).reshape(4, 6)
    y = cp.empty_like(x)
    ctx = StepContext(cp, kernels=gpu_kernels, train=False, device=device)
    with device.compute:
        layer.forward([x], y, {"mask": cp.zeros((4, 6), bool)}, ctx)
    device.synchronize()
    np.testing.assert_array_equal(to_numpy(y), to_numpy(x))


@pytest.mark.parametrize("layer", [ReLU(), ReLU(keep="bits"), Dropout(0.0)])
def test_in_place_layers_on_device(gpu, layer):
    """Output written over the input and input gradient over the output gradient."""
    cp, device, gpu_kernels = gpu
    layer.index = 0
    shape = (3, 4, 5, 5)
    layer.setup([shape], np.float32)
    rng = np.random.default_rng(2)
    x, gy = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    ctx = StepContext(cp, kernels=gpu_kernels, train=True, device=device)
    with device.compute:
        aux = {k: cp.zeros(s, d) for k, (s, d) in layer.aux_specs().items()}
        sep = run_layer(layer, [cp.asarray(x)], cp.asarray(gy), ctx, cp)
        xa, ga = cp.array(x), cp.array(gy)
        layer.forward([xa], xa, aux, ctx)
        layer.backward([None], xa if layer.retain_output else None, ga, [ga], aux, ctx)
    device.synchronize()
    np.testing.assert_array_equal(to_numpy(xa), to_numpy(sep[0]))
    np.testing.assert_array_equal(to_numpy(ga), to_numpy(sep[2][0]))
