"""BatchNorm, LRN and a two-input Add on bf16 maps as they are, and the layers that only
move values (Concat, BatchJoin), on the GPU.

The bf16 kernels widen each value in registers, compute as the float32 kernels do and round
each output once, so they must give the bits of the widening path (layers/precision.py: the
float32 GPU kernels on bf16_to_float of the maps, then float_to_bf16), with no float32 map in
memory. Against the NumPy reference (the CPU's emulation: float32 sums in another order,
no fused multiply-adds) they agree within bf16 tolerance.
"""
import numpy as np
import pytest

from minidnn.kernels import cpu as cpu_kernels
from minidnn.kernels import mapformat
from minidnn.layers import StepContext
from minidnn.layers import precision as mixed
from minidnn.layers.batchnorm import BatchNorm2d
from minidnn.layers.lrn import LRN
from minidnn.layers.merge import Add, BatchJoin, Concat
from test_bf16_gpu import BF16, gpu, to_device  # noqa: F401, F811  (gpu: the fixture)

pytestmark = pytest.mark.gpu

# Against NumPy: a few bf16 roundings of max |value| (8 significant bits).
LOOSE = 3e-2


class Widening:
    """A kernel module whose BF16_OPS leave out `ops`: precision.py then widens the maps of
    a layer computing with them (the path the bf16 kernels replace)."""

    def __init__(self, module, ops):
        self._module = module
        self.BF16_OPS = module.BF16_OPS - frozenset(ops)

    def __getattr__(self, name):
        return getattr(self._module, name)


def to_host(cp, a):
    """A GPU array (any dense layout and dtype) as a host array of its logical shape and
    dtype (test_bf16_gpu's widens to float32, which hides the sign of a zero)."""
    flat = cp.asnumpy(mapformat.in_memory_order(a).view(np.uint8)).view(a.dtype)
    if a.ndim == 4 and not a.flags.c_contiguous:
        n, c, h, w = a.shape
        return flat.reshape(n, h, w, c).transpose(0, 3, 1, 2).copy()
    return flat.reshape(a.shape).copy()


def run(layer, xp, put, ctx, x, gy, state):
    """Forward then (in training) backward of `layer` through layers/precision.py; `state`:
    host values of its parameters and buffers. Returns {name: host array} of the outputs,
    aux buffers, parameter gradients and buffers."""
    for name, p in layer.params.items():
        p.data = put(state[name])
        p.grad = put(np.full(p.shape, np.nan, np.float32))
    for name, b in layer.buffers.items():
        b.data = put(state[name])
    y = put(np.zeros(layer.out_shape, x.dtype))
    aux = {k: put(np.zeros(s, d)) for k, (s, d) in layer.aux_specs().items()}
    xs = [put(x)]
    mixed.forward(layer, xs, y, aux, ctx)
    out = {"y": y, **{f"aux {k}": a for k, a in aux.items()},
           **{f"buffer {k}": b.data for k, b in layer.buffers.items()}}
    if ctx.train:
        gx = put(np.zeros(x.shape, x.dtype))
        mixed.backward(layer, [xs[0]], None, put(gy), [gx], aux, ctx)
        out.update({"gx": gx, **{f"grad {k}": p.grad for k, p in layer.params.items()}})
    return out


def compare(gpu, layer, shape, layout, train=True, relu=False):
    """(bf16 kernels, widening path, NumPy emulation) results of one layer call."""
    cp, device, gpu_kernels = gpu
    rng = np.random.default_rng(0)
    layer.name = layer.name or "layer"
    layer.index = 0
    layer.setup([shape], np.float32)
    assert mixed.takes_bf16(layer, gpu_kernels), "the GPU kernels take its bf16 maps"
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(BF16)
    gy = rng.standard_normal(layer.out_shape).astype(BF16)
    state = {k: (1 + 0.3 * rng.standard_normal(p.shape)).astype(np.float32)
             for k, p in layer.params.items()}
    state.update({k: (np.abs(rng.standard_normal(b.shape)) + 0.5).astype(b.dtype or np.float32)
                  for k, b in layer.buffers.items()})
    fused = frozenset({layer.name}) if relu else frozenset()
    results = []
    for module in (gpu_kernels, Widening(gpu_kernels, layer.kernel_ops)):
        with device.compute:
            ctx = StepContext(cp, kernels=module, train=train, device=device,
                              relu_in_bn=fused)
            got = run(layer, cp, lambda a: to_device(cp, a, layout if a.ndim == 4 else "nchw"),
                      ctx, x, gy, state)
            results.append({k: to_host(cp, a) for k, a in got.items()})
    ctx = StepContext(np, kernels=cpu_kernels, train=train, relu_in_bn=fused)
    results.append(run(layer, np, lambda a: a.copy(), ctx, x, gy, state))
    return results


def assert_same_bits_and_close(native, widened, numpy_emulation):
    for key, want in widened.items():
        got = native[key]
        assert got.dtype == want.dtype and got.shape == want.shape, key
        np.testing.assert_array_equal(np.atleast_1d(got).view(np.uint8),
                                      np.atleast_1d(want).view(np.uint8),
                                      err_msg=f"{key}: not the widening path's bits")
        ref = numpy_emulation[key].astype(np.float64)
        value = got.astype(np.float64)
        assert np.all(np.isfinite(value)), key
        scale = max(float(np.abs(ref).max()), 1e-30)
        err = float(np.abs(value - ref).max())
        assert err <= LOOSE * scale, f"{key}: max error {err:.3g} of max {scale:.3g}"


# C = 3: one value per thread in channels last; C = 32: 16-byte vectors (8 bf16).
@pytest.mark.parametrize("shape", [(4, 3, 5, 7), (6, 32, 6, 6)])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("relu", [False, True])
def test_batch_norm_on_bf16_maps_gives_the_widening_paths_bits(gpu, shape, layout, relu):
    native, widened, emulated = compare(gpu, BatchNorm2d(name="bn"), shape, layout, relu=relu)
    assert set(native) >= {"y", "gx", "grad weight", "aux mean", "buffer running_var"}
    assert native["y"].dtype == BF16 and native["aux invstd"].dtype == np.float32
    assert_same_bits_and_close(native, widened, emulated)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_batch_norm_evaluation_on_bf16_maps_gives_the_widening_paths_bits(gpu, layout):
    native, widened, emulated = compare(gpu, BatchNorm2d(name="bn"), (4, 16, 5, 5), layout,
                                        train=False)
    assert_same_bits_and_close(native, widened, emulated)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("size", [3, 5])
def test_lrn_on_bf16_maps_gives_the_widening_paths_bits(gpu, layout, size):
    layer = LRN(size=size, alpha=1e-2, beta=0.75, k=1.0, name="norm")
    native, widened, emulated = compare(gpu, layer, (4, 12, 5, 6), layout)
    assert native["aux scale"].dtype == np.float32
    assert_same_bits_and_close(native, widened, emulated)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_concat_and_batch_join_move_bf16_maps_as_they_are(gpu, layout):
    cp, device, gpu_kernels = gpu
    rng = np.random.default_rng(1)
    put = lambda a: to_device(cp, a, layout)          # noqa: E731
    for layer, shapes in ((Concat(name="cat"), [(2, 3, 4, 4), (2, 5, 4, 4)]),
                          (BatchJoin(name="join"), [(2, 6, 3, 3), (2, 6, 3, 3)])):
        layer.setup(shapes, np.float32)
        assert mixed.takes_bf16(layer, gpu_kernels) and mixed.takes_bf16(layer, cpu_kernels)
        xs = [rng.standard_normal(s).astype(BF16) for s in shapes]
        gy = rng.standard_normal(layer.out_shape).astype(BF16)
        with device.compute:
            ctx = StepContext(cp, kernels=gpu_kernels, device=device)
            y = put(np.zeros(layer.out_shape, BF16))
            mixed.forward(layer, [put(x) for x in xs], y, None, ctx)
            gxs = [put(np.zeros(s, BF16)) for s in shapes]
            mixed.backward(layer, [None] * len(xs), None, put(gy), gxs, None, ctx)
            got_y, got_gxs = to_host(cp, y), [to_host(cp, g) for g in gxs]
        want_y = np.zeros(layer.out_shape, BF16)
        layer.forward(xs, want_y, None, StepContext(np))
        want_gxs = [np.zeros(s, BF16) for s in shapes]
        layer.backward(xs, None, gy, want_gxs, None, StepContext(np))
        np.testing.assert_array_equal(got_y.view(np.uint16), want_y.view(np.uint16))
        for g, w in zip(got_gxs, want_gxs):
            np.testing.assert_array_equal(g.view(np.uint16), w.view(np.uint16))


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_a_two_input_add_on_bf16_maps_gives_the_widening_paths_bits(gpu, layout):
    cp, device, gpu_kernels = gpu
    rng = np.random.default_rng(2)
    layer = Add(name="add")
    shape = (4, 8, 5, 5)
    layer.setup([shape, shape], np.float32)
    assert mixed.takes_bf16(layer, gpu_kernels)
    three = Add(name="add3")
    three.setup([shape] * 3, np.float32)
    assert not mixed.takes_bf16(three, gpu_kernels)   # rounding between adds: widened
    xs = [rng.standard_normal(shape).astype(BF16) for _ in range(2)]
    gy = rng.standard_normal(shape).astype(BF16)
    results = []
    for module in (gpu_kernels, Widening(gpu_kernels, ("add",))):
        with device.compute:
            ctx = StepContext(cp, kernels=module, device=device)
            y = to_device(cp, np.zeros(shape, BF16), layout)
            mixed.forward(layer, [to_device(cp, x, layout) for x in xs], y, None, ctx)
            gxs = [to_device(cp, np.zeros(shape, BF16), layout) for _ in xs]
            mixed.backward(layer, [None, None], None, to_device(cp, gy, layout), gxs, None, ctx)
            results.append([to_host(cp, a).view(np.uint16) for a in (y, *gxs)])
    for got, want in zip(*results):
        np.testing.assert_array_equal(got, want)
    want_y = (xs[0].astype(np.float32) + xs[1].astype(np.float32)).astype(BF16)
    np.testing.assert_array_equal(results[0][0], want_y.view(np.uint16))
    np.testing.assert_array_equal(results[0][1], gy.view(np.uint16))
