"""Layers on bf16 maps on the GPU, computed by kernels that take bf16 themselves (cuDNN's and
cuBLAS's bf16 plans, the raw kernels' bf16 instances), against the CPU's emulation of mixed
precision (layers/precision.py: widen, float32 compute, round once).

The native kernels keep the contract (float32 sums, outputs rounded once) except where
layers/precision.py says: a convolution rounds its weights, its output before the bias and its
weight gradient to bf16, a matrix product its weights. So values that involve those roundings
are compared within bf16 tolerance; ReLU, max pooling and dropout move values without
arithmetic (or with one float32 product) and must match bit for bit.
"""
import numpy as np
import pytest

from minidnn import kernels
from minidnn.backend import Device
from minidnn.kernels import cpu as cpu_kernels
from minidnn.kernels import mapformat
from minidnn.layers import AvgPool2d, Conv2d, Dropout, Linear, MaxPool2d, ReLU, StepContext
from minidnn.layers import precision as mixed

pytestmark = pytest.mark.gpu

BF16 = mapformat.bfloat16()
# bf16 keeps 8 significant bits: a few roundings of the operands and the results.
LOOSE = 3e-2


@pytest.fixture(scope="module")
def gpu():
    cp = pytest.importorskip("cupy")
    device = Device("gpu")
    return cp, device, kernels.for_device(device)


def to_device(cp, a, layout):
    """Host array `a` (bf16 or float32) on the GPU in `layout`, through its raw bytes."""
    host = mapformat.arrange(a, layout)
    flat = cp.asarray(host.reshape(-1).view(np.uint8))
    return mapformat.shaped(flat, a.shape, a.dtype, layout)


def to_host(cp, a):
    """A GPU array (any dense layout, bf16 or float32) as a float32 host array of its shape."""
    flat = cp.asnumpy(mapformat.in_memory_order(a).view(np.uint8)).view(a.dtype)
    if a.ndim == 4 and not a.flags.c_contiguous:
        n, c, h, w = a.shape
        return flat.reshape(n, h, w, c).transpose(0, 3, 1, 2).astype(np.float32)
    return flat.reshape(a.shape).astype(np.float32)


def run(layer, xp, put, ctx, x, gy, params, aux_fill):
    """Forward then backward of `layer` through layers/precision.py on bf16 maps made by
    `put` (host array -> array of module xp). Returns the results as host float32 arrays."""
    for name, p in layer.params.items():
        p.data = put(params[name])
        p.grad = put(np.full(p.shape, np.nan, np.float32))
    xs = [put(x)]
    y = put(np.zeros(layer.out_shape, BF16))
    aux = {k: put(aux_fill(k, s, d)) for k, (s, d) in layer.aux_specs().items()}
    mixed.forward(layer, xs, y, aux, ctx)
    gx = put(np.zeros(x.shape, BF16))
    mixed.backward(layer, [xs[0] if 0 in layer.retain_inputs else None],
                   y if layer.retain_output else None, put(gy), [gx], aux, ctx)
    return {"y": y, "gx": gx, **{f"aux {k}": a for k, a in aux.items()},
            **{f"grad {k}": p.grad for k, p in layer.params.items()}}


CASES = [
    (Conv2d(32, 3, padding=1), (4, 16, 12, 12), False),
    (Conv2d(16, 5, stride=2, padding=2), (4, 8, 17, 17), False),
    (Conv2d(24, 1, bias=False), (3, 8, 7, 7), False),
    (ReLU(), (4, 16, 6, 6), True),
    (ReLU(keep="bits"), (4, 16, 6, 6), True),
    (MaxPool2d(3, stride=2), (4, 16, 13, 13), True),
    (MaxPool2d(2), (4, 8, 8, 8), True),
    (AvgPool2d(3, stride=2, padding=1), (4, 16, 13, 13), False),
    (Dropout(0.5), (4, 16, 6, 6), True),
]


@pytest.mark.parametrize("layer, shape, exact, layout",
                         [(*case, layout) for case in CASES for layout in ("nchw", "nhwc")]
                         + [(Linear(40), (6, 72), False, "nchw")])   # 2-D: one layout
def test_native_bf16_layer_matches_the_cpu_emulation(gpu, layer, shape, exact, layout):
    cp, device, gpu_kernels = gpu
    rng = np.random.default_rng(0)
    layer.index = 0
    layer.setup([shape], np.float32)
    assert mixed.takes_bf16(layer, gpu_kernels), "the GPU kernels take this layer's bf16 maps"
    assert not mixed.takes_bf16(layer, cpu_kernels)
    params = {k: (rng.standard_normal(p.shape) * 0.3).astype(np.float32)
              for k, p in layer.params.items()}
    x = rng.standard_normal(shape).astype(BF16)
    x.reshape(-1)[::7] = 0                 # zeros: ReLU's and max pooling's ties
    gy = rng.standard_normal(layer.out_shape).astype(BF16)
    mask = (rng.random(shape) >= 0.5)      # dropout: the GPU's mask is given to both

    def aux_fill(name, s, d):
        return mask if name == "mask" and layer.kind == "dropout" else np.zeros(s, d)

    with device.compute:
        gctx = StepContext(cp, kernels=gpu_kernels, train=True, device=device, dropout=False)
        got = run(layer, cp, lambda a: to_device(cp, a, layout if a.ndim == 4 else "nchw"),
                  gctx, x, gy, params, aux_fill)
        got = {k: to_host(cp, a) for k, a in got.items()}
    ctx = StepContext(np, kernels=cpu_kernels, train=True, dropout=False)
    want = run(layer, np, lambda a: a.copy(), ctx, x, gy, params, aux_fill)
    want = {k: np.asarray(a).astype(np.float32) for k, a in want.items()}
    for key, w in want.items():
        g = got[key]
        assert g.shape == w.shape, key
        assert np.all(np.isfinite(g)), f"{key}: not fully written"
        if key.startswith("aux") and layout == "nhwc" and layer.kind == "relu":
            continue                        # the bits follow memory order (test_layers_gpu)
        if exact or key.startswith("aux"):
            np.testing.assert_array_equal(g, w, err_msg=key)
        else:
            scale = max(float(np.abs(w).max()), 1e-30)
            err = float(np.abs(g - w).max())
            assert err <= LOOSE * scale, f"{key}: max error {err:.3g} of max {scale:.3g}"


def test_dropout_draws_the_same_bf16_outputs_as_float32_maps(gpu):
    """Dropout in training on bf16 maps: kept values scaled by 1 / (1 - p) in float32 and
    rounded once; dropped values 0; the mask is the float32 run's."""
    cp, device, gpu_kernels = gpu
    layer = Dropout(0.3)
    layer.index = 0
    layer.setup([(8, 64)], np.float32)
    x = np.random.default_rng(1).standard_normal((8, 64)).astype(BF16)
    outs = {}
    with device.compute:
        for dtype in (BF16, np.float32):
            ctx = StepContext(cp, kernels=gpu_kernels, train=True, device=device, seed=3,
                              step=0)
            xd = to_device(cp, x.astype(dtype), "nchw")
            y = to_device(cp, np.zeros((8, 64), dtype), "nchw")
            mask = cp.zeros((8, 64), dtype=np.bool_)
            mixed.forward(layer, [xd], y, {"mask": mask}, ctx)
            outs[np.dtype(dtype).name] = (to_host(cp, y), cp.asnumpy(mask))
    (y16, m16), (y32, m32) = outs["bfloat16"], outs["float32"]
    np.testing.assert_array_equal(m16, m32)
    np.testing.assert_array_equal(y16, y32.astype(BF16).astype(np.float32))


def test_the_passes_of_a_batch_share_one_bf16_copy_of_each_weight(gpu):
    """kernels.shared_weight_copies (the executor's scope for a batch's passes): each weight
    is rounded to bf16 once and every call in the scope reads that copy; outside, each call
    makes its own. The copy is the weight rounded to nearest even either way."""
    cp, device, gpu_kernels = gpu
    from minidnn.kernels import cuda_weights
    host = np.random.default_rng(0).standard_normal((8, 5)).astype(np.float32)
    with device.compute:
        w = cp.asarray(host)
        alone = [cuda_weights.weights_in(w, BF16) for _ in range(2)]
        with gpu_kernels.shared_weight_copies():
            shared = [cuda_weights.weights_in(w, BF16) for _ in range(2)]
        after = cuda_weights.weights_in(w, BF16)
    assert alone[0] is not alone[1] and shared[0] is shared[1] and after is not shared[0]
    for copy in (alone[1], shared[0], after):
        np.testing.assert_array_equal(to_host(cp, copy), host.astype(BF16).astype(np.float32))


def test_a_bf16_matrix_product_makes_no_float32_map_of_its_own(gpu, monkeypatch):
    """Linear on bf16 maps: the forward call computes its output in the float32 buffer
    carved from its scratch block (the size temporary_bytes declares for it), and backward
    sums the bias gradient from the bf16 gradient as it reads it. Neither asks CuPy for a
    float32 array: a temporary no plan counts. The bias gradient is NumPy's sum of the
    widened gradient over the batch, bit for bit (row after row, in float32)."""
    cp, device, gpu_kernels = gpu
    layer = Linear(300)
    layer.index = 0
    layer.setup([(256, 72)], np.float32)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((256, 72)).astype(BF16)
    gy = rng.standard_normal((256, 300)).astype(BF16)
    maps = [((256, 72), BF16), ((256, 300), BF16)]
    nbytes = mixed.temporary_bytes(layer, gpu_kernels.BF16_OPS, maps, "forward")
    assert nbytes == 256 * 300 * 4
    made = []
    empty = cp.empty

    def noting(shape, dtype=float, *args, **kw):
        made.append((shape, np.dtype(dtype)))
        return empty(shape, dtype, *args, **kw)

    with device.compute:
        for name, p in layer.params.items():
            p.data = cp.asarray((rng.standard_normal(p.shape) * 0.3).astype(np.float32))
            p.grad = cp.full(p.shape, np.nan, np.float32)
        xd, gyd = to_device(cp, x, "nchw"), to_device(cp, gy, "nchw")
        y, gx = cp.zeros((256, 300), BF16), cp.zeros((256, 72), BF16)
        block = cp.zeros(nbytes, np.uint8)
        monkeypatch.setattr(cp, "empty", noting)
        ctx = StepContext(cp, kernels=gpu_kernels, train=True, device=device)
        ctx.scratch = block
        mixed.forward(layer, [xd], y, {}, ctx)
        ctx.scratch = None
        mixed.backward(layer, [xd], None, gyd, [gx], {}, ctx)
        monkeypatch.setattr(cp, "empty", empty)
        gb = cp.asnumpy(layer.params["bias"].grad)
    assert not [m for m in made if m[1] == np.float32], made
    np.testing.assert_array_equal(gb, gy.astype(np.float32).sum(axis=0))
    assert np.isfinite(to_host(cp, y)).all() and np.isfinite(to_host(cp, gx)).all()
